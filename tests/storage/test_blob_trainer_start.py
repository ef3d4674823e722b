"""A checkpoint directory that cannot be used (a missing container, a wrong key, another run's) stops
training before its first step, on every rank, with one line, not at the first save an epoch later. The
loop is the real one on rank threads (tests/fakes/fake_backend.py: a test double of a binding); storage is
Azurite."""

from __future__ import annotations

import pytest
from fakes.fake_backend import FakeTrainer, LinearProblem, ThreadWorld

from hvdazure.core.checkpoint.store import CheckpointError, CheckpointManager
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.object_store import filesystem
from storage.azurite import ACCOUNT_KEY, Azurite, use_connection_string


def _fit_two_ranks(checkpoint_dir: str, **fields: object) -> tuple[list[BaseException], list[FakeTrainer]]:
    world = ThreadWorld(2)
    config = TrainConfig(lr=0.05, epochs=2, batch_size=4, progress_bar=False, checkpoint_dir=checkpoint_dir,
                         checkpoint_every_steps=3).replace(**fields)
    trainers = [FakeTrainer(world, rank, LinearProblem.make(37), config) for rank in range(2)]
    errors: list[BaseException] = []

    def fit(trainer: FakeTrainer) -> None:
        try:
            trainer.fit()
        except (CheckpointError, ConfigError) as exc:
            errors.append(exc)

    world.run([lambda t=t: fit(t) for t in trainers])
    return errors, trainers


@pytest.mark.parametrize("problem", ["a missing container", "a wrong key"])
def test_an_unusable_checkpoint_dir_fails_on_every_rank_before_the_first_step(
        azurite: Azurite, blob_url: str, monkeypatch: pytest.MonkeyPatch, problem: str) -> None:
    if problem == "a missing container":
        run, says = "abfs://no-such-container/run1", "the container does not exist"
    else:
        use_connection_string(monkeypatch, azurite.connection_string().replace(ACCOUNT_KEY, "A" * 86 + "=="))
        run, says = f"{blob_url}/run1", "authentication failed"

    errors, trainers = _fit_two_ranks(run)

    assert len(errors) == 2 and all(run in str(e) and says in str(e) for e in errors), errors
    assert len({str(e) for e in errors}) == 1  # the same line on every rank
    assert "\n" not in str(errors[0]) and ACCOUNT_KEY not in str(errors[0])
    assert [t.state.step for t in trainers] == [0, 0]  # not one step trained


def test_a_checkpoint_dir_on_a_container_that_exists_but_holds_nothing_yet_trains(blob_url: str) -> None:
    errors, trainers = _fit_two_ranks(f"{blob_url}/fresh/run1")

    assert errors == []
    assert trainers[0].state.epoch == 2


def _blobs(url: str) -> dict[str, bytes]:
    fs, root = filesystem(url)
    return {path: fs.cat_file(path) for path in sorted(fs.find(root))}


def test_a_fresh_run_into_a_blob_directory_holding_another_run_is_refused_and_resume_auto_keeps_its_id(
        blob_url: str) -> None:
    run = f"{blob_url}/shared/run1"
    assert _fit_two_ranks(run)[0] == []
    before = _blobs(run)

    errors, trainers = _fit_two_ranks(run, epochs=3)  # another fresh run, into the same directory

    assert len(errors) == 2 and isinstance(errors[0], ConfigError)
    assert str(errors[0]).startswith(f"config field 'checkpoint_dir': {run} holds the checkpoints of another "
                                     "run (run ")
    assert [t.state.step for t in trainers] == [0, 0] and _blobs(run) == before  # nothing written

    errors, trainers = _fit_two_ranks(run, epochs=3, resume="auto")

    assert errors == [] and trainers[0].state.epoch == 3
    ids = {c.run_id for c in CheckpointManager(run).checkpoints()}
    assert len(ids) == 1 and None not in ids
