"""hvdazure's own callbacks (LR schedule, progress, early stopping, periodic checkpoints) talk to the run
(core/run_protocol.py's Run, the loop), not to the user's trainer: a subclass that gives `log`, `set_lr`,
`save_checkpoint`, `finished`, `schedule` or `step_times` a meaning of its own changes nothing they do, while
the user's callbacks keep receiving the user's trainer. On the real loop, 2 thread ranks (ThreadWorld)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.fake_backend import FakeTrainer, LinearProblem, ThreadWorld

from hvdazure.core.callbacks import Callback
from hvdazure.core.checkpoint.store import CheckpointManager
from hvdazure.core.config import TrainConfig


class OwnMeanings(FakeTrainer):
    """A user's trainer whose public names do something of its own: it records each call and does nothing
    else, so a built-in part that reached one of them would lose what it meant to do."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.calls: list[str] = []
        super().__init__(*args, **kwargs)

    def log(self, message: str) -> None:
        self.calls.append(f"log {message}")

    def set_lr(self, lr: float) -> None:
        self.calls.append(f"set_lr {lr}")

    def save_checkpoint(self, reason: str = "manual", wait: bool = True) -> str | None:
        self.calls.append(f"save_checkpoint {reason}")
        return None

    @property
    def finished(self) -> bool:
        self.calls.append("finished")
        return True

    @property
    def schedule(self) -> Any:
        self.calls.append("schedule")
        return super().schedule

    @property
    def step_times(self) -> Any:
        self.calls.append("step_times")
        return None


class UsersOwn(Callback):
    """A user's callback: given the user's trainer, whose own `log` it reaches."""

    def __init__(self) -> None:
        self.given: list[type] = []

    def on_epoch_end(self, trainer: Any) -> None:
        self.given.append(type(trainer))
        trainer.log("the user's callback says so")


def test_a_trainer_subclass_own_public_names_never_reach_the_built_in_callbacks(
        tmp_path: Path, rank0_log: list[str]) -> None:
    config = TrainConfig(epochs=2, batch_size=3, lr=0.05, base_batch_size=3, warmup_steps=3, log_every=1,
                         progress_bar=False, checkpoint_dir=str(tmp_path), checkpoint_every_steps=2,
                         keep_last=10, early_stopping_patience=5, monitor="train_loss")
    world = ThreadWorld(2)
    own = [UsersOwn() for _ in range(2)]
    trainers = [OwnMeanings(world, rank, LinearProblem.make(24), config, [own[rank]]) for rank in range(2)]

    world.run([trainer.fit for trainer in trainers])

    # the user's callback got the user's trainer, and its call went to the user's `log`
    assert [o.given for o in own] == [[OwnMeanings, OwnMeanings]] * 2
    for trainer in trainers:
        assert trainer.calls == ["log the user's callback says so"] * 2
    # the built-in parts did what they do: the warmup ramp from lr 0.05 to 0.1 (0.05 x 6/3) set on the
    # optimizer step by step, checkpoints every 2 steps, the progress lines in the log
    for trainer in trainers:
        assert [s.lr for s in trainer.steps] == pytest.approx([0.05, 0.05 + 0.05 / 3, 0.05 + 0.1 / 3,
                                                               *[0.1] * 5], rel=1e-12)
    assert [c.step for c in CheckpointManager(str(tmp_path)).checkpoints()] == [2, 4, 6, 8]
    assert any(line.startswith("training on 2 ranks") for line in rank0_log), rank0_log
    assert sum(line.startswith("epoch ") and " done: " in line for line in rank0_log) == 2, rank0_log
