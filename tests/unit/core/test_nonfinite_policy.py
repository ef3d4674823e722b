"""The policy for a loss or gradients that become NaN or infinite (core/nonfinite.py): what its one line
says, read from every rank's record; and, on ranks simulated by threads (tests/fakes/fake_backend.py),
that the loop stops every rank at the next reduction, before a checkpoint or a signal's save would write
one, and that rank 0 writes no checkpoint of weights that are not finite. The bindings' records (inside
the step, on the device) are tested on real ranks: tests/distributed/test_nonfinite.py."""

from __future__ import annotations

import math
import signal
from pathlib import Path

import numpy as np
import pytest
from fakes.fake_backend import FakeCheckpointContent, FakeTrainer, LinearProblem, ThreadWorld

from hvdazure.core.callbacks import Callback
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.nonfinite import NO_RECORD, NonFiniteError, first_step, stop_line, what_went_wrong
from hvdazure.core.trainer import Trainer, loop_of

NAN, INF = math.nan, math.inf


# --- the line ---------------------------------------------------------------------------------------------
def test_a_nan_loss_on_one_rank_is_named_with_its_step_and_rank():
    rows = [[0, 0, 6, 0], [6, NAN, 6, 0]]  # rank 1's loss at step 6; every rank's gradients after it
    assert what_went_wrong(rows) == "training_step returned a non-finite loss (nan) at step 6 on rank 1"
    assert first_step(rows) == 6


def test_the_first_step_wins_and_every_rank_at_it_is_named_with_its_values():
    rows = [[7, NAN, 0, 0], [5, INF, 0, 0], [5, -INF, 0, 0]]
    assert what_went_wrong(rows) == ("training_step returned a non-finite loss (-inf and inf) at step 5 on "
                                     "ranks 1, 2")


def test_gradients_that_went_non_finite_with_every_loss_finite_are_said_so():
    rows = [[0, 0, 9, 0], [0, 0, 9, 0]]
    assert what_went_wrong(rows) == ("gradients became non-finite after the allreduce at step 9 (the loss "
                                     "was finite on every rank)")
    assert what_went_wrong([list(NO_RECORD)] * 2) is None


@pytest.mark.parametrize(("newest", "checkpointing", "said"), [
    ("step-00000004", True, "the newest finite checkpoint is step-00000004"),
    (None, True, "no checkpoint of this run holds finite weights"),
    (None, False, "no checkpoint was written (checkpoint_dir is not set)")])
def test_the_line_names_the_stop_the_last_finite_weights_and_the_newest_finite_checkpoint(
        newest, checkpointing, said):
    line = stop_line("WHAT", 6, 10, newest, checkpointing)
    assert line.startswith(f"WHAT; stopped all ranks at step 10 (the weights of step 5 were the last finite "
                           f"ones); {said}. ")
    assert "\n" not in line and "on_nan_loss: skip" in line


def test_the_config_field_takes_stop_or_skip_and_names_a_bad_value():
    assert TrainConfig().on_nan_loss == "stop"
    assert TrainConfig(on_nan_loss="skip").on_nan_loss == "skip"
    with pytest.raises(ConfigError, match="field 'on_nan_loss': 'ignore' is not one of 'stop', 'skip'"):
        TrainConfig(on_nan_loss="ignore")


# --- the loop, on ranks as threads -----------------------------------------------------------------------
class Record(Callback):
    """Plays a binding's record: after step `step`, `rank` reports a NaN loss at that step."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.rank == self.rank and trainer.state.step == self.step:
            record = [float(self.step), NAN, 0.0, 0.0]
            loop_of(trainer).backend.nonfinite_record = lambda: record  # type: ignore[method-assign]


class Spoil(Callback):
    """Makes rank 0's weights NaN after step `step` (as an update that overflowed would), unrecorded."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.rank == 0 and trainer.state.step == self.step:
            trainer.backend.weights = trainer.backend.weights * NAN  # type: ignore[attr-defined]


class Signal(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, trainer: Trainer) -> None:
        if trainer.rank == 0 and trainer.state.step + 1 == self.step:
            trainer.receive_signal(signal.SIGTERM)  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def fake_checks_its_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake's checkpoint content, with the check the bindings' have."""
    def nonfinite_weight(self: FakeCheckpointContent) -> str | None:
        return None if np.isfinite(self.backend.weights).all() else "weights"

    monkeypatch.setattr(FakeCheckpointContent, "nonfinite_weight", nonfinite_weight, raising=False)


def run(tmp_path: Path, callbacks: list[Callback], **fields: object) -> BaseException:
    config = TrainConfig(**{"lr": 0.05, "progress_bar": False, "epochs": 2, "batch_size": 2, "log_every": 10,
                            "checkpoint_dir": str(tmp_path / "checkpoints"), "checkpoint_every_steps": 4,
                            "checkpoint_async": False, **fields})  # type: ignore[arg-type]
    world = ThreadWorld(2)
    trainers = [FakeTrainer(world, rank, LinearProblem.make(37), config, callbacks) for rank in range(2)]
    with pytest.raises((NonFiniteError, SystemExit)) as raised:
        world.run([trainer.fit for trainer in trainers])
    return raised.value


def latest(tmp_path: Path) -> str:
    return (tmp_path / "checkpoints" / "latest").read_text().strip()


def test_a_recorded_nan_stops_every_rank_before_the_next_checkpoint_is_written(tmp_path):
    error = run(tmp_path, [Record(rank=1, step=6)])

    assert isinstance(error, NonFiniteError) and error.exit_status == 1
    assert str(error).startswith("training_step returned a non-finite loss (nan) at step 6 on rank 1; "
                                 "stopped all ranks at step 8 (the weights of step 5 were the last finite "
                                 "ones); the newest finite checkpoint is step-00000004. ")
    assert latest(tmp_path) == "step-00000004"
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == ["step-00000004"]


def test_a_stop_signal_after_a_nan_saves_nothing_and_stops_for_the_nan(tmp_path):
    error = run(tmp_path, [Record(rank=1, step=5), Signal(step=7)])

    assert isinstance(error, NonFiniteError), error  # not the signal's exit 143 after a save of NaN weights
    assert "at step 5 on rank 1; stopped all ranks at step 7" in str(error)
    assert latest(tmp_path) == "step-00000004"


def test_rank_0_writes_no_checkpoint_of_weights_that_are_not_finite(tmp_path):
    error = run(tmp_path, [Spoil(step=6)])

    assert isinstance(error, NonFiniteError)  # on every rank: the save's outcome is shared
    assert str(error) == ("the model's weight 'weights' holds NaN or infinite values at step 8: no "
                          "checkpoint of it written; stopped all ranks; the newest finite checkpoint is "
                          "step-00000004")
    assert latest(tmp_path) == "step-00000004"


def test_skip_goes_on_and_the_emergency_save_after_an_error_writes_no_nan_weights(tmp_path):
    class Fail(Callback):
        def on_step_end(self, trainer: Trainer) -> None:
            if trainer.state.step == 7:
                raise RuntimeError("a callback failed")

    config = TrainConfig(lr=0.05, progress_bar=False, batch_size=2, log_every=10, on_nan_loss="skip",
                         checkpoint_dir=str(tmp_path / "checkpoints"), checkpoint_every_steps=4,
                         checkpoint_async=False)
    world = ThreadWorld(2)
    trainers = [FakeTrainer(world, rank, LinearProblem.make(37), config, [Spoil(6), Fail()])
                for rank in range(2)]
    with pytest.raises(RuntimeError, match="a callback failed"):
        world.run([trainer.fit for trainer in trainers])
    assert latest(tmp_path) == "step-00000004"  # the emergency save of step 7 was refused


def test_fp16_overflow_skips_are_told_as_loss_scaling_not_as_the_nan_policy(caplog):
    # was: fp16's own overflow skips were a warning naming config field on_nan_loss, which played no part
    from hvdazure.core.nonfinite import SKIPPED_STEPS, NonFiniteWatch

    row = list(NO_RECORD)
    row[SKIPPED_STEPS] = 2.0
    with caplog.at_level("INFO", logger="hvdazure"):
        NonFiniteWatch("stop", is_main=True, loss_scaling=True).check([row, row], 5, None)
        NonFiniteWatch("skip", is_main=True).check([row, row], 5, None)
    fp16, policy = caplog.records
    assert (fp16.levelname, fp16.getMessage()) == (
        "INFO", "fp16 loss scaling skipped 2 step(s) whose scaled gradients overflowed, up to step 5 (2 in "
        "this run so far; the loss scale is lowered after each)")
    assert policy.levelname == "WARNING" and "config field on_nan_loss" in policy.getMessage()
