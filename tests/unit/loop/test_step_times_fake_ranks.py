"""Where the time goes, in the real loop on simulated ranks (tests/fakes/fake_backend.py, a test double of a
framework backend that charges its phases as the bindings do): the same breakdown on every rank, per log
interval, with the phase that was made slow standing out. The delays are tens of milliseconds against a
step of microseconds, so the shares asserted hold with a wide margin on a loaded machine."""

import time

import pytest
from fakes.fake_backend import FakeTrainer, LinearProblem, ThreadWorld

from hvdazure import Callback, TrainConfig

PROBLEM = LinearProblem.make(num_samples=48, num_eval=12, dim=3, seed=1)


class Records(Callback):
    """Every log interval's breakdown as the trainer shows it to loggers."""

    def __init__(self) -> None:
        self.seen: list = []

    def on_step_end(self, trainer):
        if trainer.state.metrics_reduced:
            self.seen.append(trainer.step_times)


class SlowCallback(Callback):
    def on_step_end(self, trainer):
        time.sleep(0.02)


class SlowLoader(FakeTrainer):
    data_delay = 0.02


class SlowStep(FakeTrainer):
    def training_metrics(self, indices):
        time.sleep(0.02)
        return {}


def _fit(world_size, trainer_class=FakeTrainer, callbacks=(), **fields):
    config = TrainConfig(**{"epochs": 1, "batch_size": 4, "lr": 0.05, "progress_bar": False, "log_every": 3,
                            **fields})
    world = ThreadWorld(world_size)
    records = [Records() for _ in range(world_size)]
    trainers = [trainer_class(world, rank, PROBLEM, config, [records[rank], *callbacks])
                for rank in range(world_size)]
    world.run([t.fit for t in trainers])
    return trainers, [r.seen for r in records]


@pytest.mark.parametrize(("trainer_class", "callbacks", "slow"), [
    (SlowLoader, (), "data"), (SlowStep, (), "compute"), (FakeTrainer, (SlowCallback(),), "other")])
def test_the_slow_phase_stands_out_in_every_interval_on_every_rank(trainer_class, callbacks, slow):
    trainers, seen = _fit(2, trainer_class, callbacks)  # 48 samples, global batch 8: 6 steps, 2 intervals
    assert [len(s) for s in seen] == [2, 2]
    first, second = seen[0]
    assert first.steps == 2 and first.startup > 0.0  # steps 2-3: the fit's first step is start-up
    assert second.steps == 3 and second.startup == 0.0
    for interval in seen[0]:
        shares = interval.shares()
        assert shares[slow] > 0.6, (slow, shares)
        assert sum(shares.values()) == pytest.approx(1.0)
        assert interval.samples == 8 * interval.steps and interval.ranks == 2
    for mine, theirs in zip(seen[0], seen[1], strict=True):  # reduced: the same numbers on every rank
        assert mine.seconds == theirs.seconds and (mine.wall, mine.steps) == (theirs.wall, theirs.steps)
    assert trainers[0].step_times is seen[0][-1]


def test_evaluation_and_checkpoint_stalls_are_phases_of_their_own(tmp_path):
    _, seen = _fit(1, log_every=1, epochs=2, checkpoint_dir=str(tmp_path), checkpoint_async=False)
    after_epoch = [s for s in seen[0] if s.seconds["eval"] > 0.0]
    assert after_epoch and all(s.seconds["checkpoint"] > 0.0 for s in after_epoch)
    assert all(s.seconds["eval"] == 0.0 for s in seen[0] if s not in after_epoch)


def test_a_run_without_evaluation_data_shows_no_evaluation_phase():
    world = ThreadWorld(1)
    config = TrainConfig(epochs=2, batch_size=4, lr=0.05, progress_bar=False, log_every=1)
    records = Records()
    trainer = FakeTrainer(world, 0, LinearProblem.make(num_samples=48, dim=3, seed=1), config, [records])
    world.run([trainer.fit])
    assert records.seen and all(s.seconds["eval"] == 0.0 for s in records.seen)
    assert all("eval" not in s.shares() for s in records.seen)


class OnGpus(FakeTrainer):
    """Each rank reports its device as a GPU rank would: rank r peaks at (r + 1) GiB allocated, (r + 2) GiB
    reserved, at 50 + 10 r % busy."""

    def device_stats(self):
        return (self.rank + 1) * 2.0**30, (self.rank + 2) * 2.0**30, 50.0 + 10 * self.rank


def test_each_ranks_gpu_numbers_ride_the_intervals_collective_to_every_rank_as_highest_and_lowest():
    _, seen = _fit(3, OnGpus)  # 48 samples, global batch 12: 4 steps, one log interval (steps 2-3)

    assert [len(s) for s in seen] == [1, 1, 1]
    for rank_seen in seen:  # the same numbers on every rank
        (_, memory), (_, reserved), (_, utilization) = rank_seen[-1].device.spreads()
        assert (memory.high, memory.high_rank, memory.low, memory.low_rank) == (3 * 2.0**30, 2, 2.0**30, 0)
        assert (reserved.high, reserved.low) == (4 * 2.0**30, 2 * 2.0**30)
        assert (utilization.high, utilization.low) == (70.0, 50.0)
        assert rank_seen[-1].compact().endswith("| gpu peak 1-3 GiB reserved 2-4 GiB util 50-70%")
    assert "gpu_memory_peak_gib_max" in seen[0][-1].scalars()


def test_on_cpus_the_step_times_show_no_device_numbers():
    _, seen = _fit(2)
    assert seen[0][-1].device.spreads() == [] and "gpu" not in seen[0][-1].compact()


def test_with_step_times_off_nothing_is_timed_or_reduced():
    trainers, seen = _fit(2, step_times=False)
    assert seen == [[None, None], [None, None]] and trainers[0].step_times is None
