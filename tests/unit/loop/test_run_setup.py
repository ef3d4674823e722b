"""The run's setup (core/run_setup.py): one frozen record that fit() makes before its first step and the loop
holds; the trainer's read-only facts come from it, and a run replaces its schedule by a new record only."""

from __future__ import annotations

import dataclasses

import pytest
from fakes.fake_backend import FakeTrainer, LinearProblem, ThreadWorld

from hvdazure.core.config import TrainConfig
from hvdazure.core.run_setup import RunSetup
from hvdazure.core.trainer import loop_of


def _trainer(world: ThreadWorld, **config: object) -> FakeTrainer:
    return FakeTrainer(world, 0, LinearProblem.make(16),
                       TrainConfig(lr=0.05, batch_size=2, progress_bar=False, **config))  # type: ignore[arg-type]


def test_before_fit_there_is_no_setup_and_the_facts_are_the_defaults() -> None:
    trainer = _trainer(ThreadWorld(1), epochs=1)
    loop = loop_of(trainer)

    with pytest.raises(AttributeError, match="setup is made by fit"):
        loop.setup  # noqa: B018
    with pytest.raises(AttributeError):
        trainer.schedule  # noqa: B018
    assert (trainer.rank, trainer.world_size, trainer.local_rank, trainer.callbacks) == (0, 1, 0, [])
    assert loop.checkpoints is None


def test_fit_makes_one_frozen_record_the_trainers_facts_read() -> None:
    world = ThreadWorld(1)
    trainer = _trainer(world, epochs=1)
    world.run([trainer.fit])
    setup = loop_of(trainer).setup

    assert isinstance(setup, RunSetup)
    for field in dataclasses.fields(RunSetup):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(setup, field.name, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setup.ranks.rank = 1  # type: ignore[misc]
    assert trainer.schedule is setup.schedule and trainer.sample_plan is setup.sample_plan
    assert trainer.collectives is setup.ranks.collectives
    assert (trainer.rank, trainer.world_size) == (setup.ranks.rank, setup.ranks.world_size) == (0, 1)
    assert trainer.callbacks == list(setup.callbacks)
    assert trainer.steps_per_epoch == setup.sample_plan.steps_per_epoch == 8


def test_max_steps_and_fit_again_replace_the_record_not_its_pieces() -> None:
    world = ThreadWorld(1)
    trainer = _trainer(world, epochs=2, max_steps=3)
    records = []

    def fit_twice() -> None:
        trainer.fit()
        records.append(loop_of(trainer).setup)
        trainer.config = trainer.config.replace(max_steps=5)
        trainer.fit()
        records.append(loop_of(trainer).setup)

    world.run([fit_twice])
    first, again = records

    assert again is not first and first.schedule.total_steps == 3  # ended at max_steps, and unchanged
    assert again.schedule.total_steps == 5 and trainer.schedule is again.schedule
    assert again.schedule.peak_lr == first.schedule.peak_lr
    kept = [f.name for f in dataclasses.fields(RunSetup) if f.name != "schedule"]
    assert all(getattr(again, name) is getattr(first, name) for name in kept)
    assert first.ending_at_max_steps(None, trainer.state) is first
