"""The overhead benchmark's arithmetic: steady-state block time, bookkeeping, per-pair ratios."""

import pytest

from hvdazure.bench import overhead
from hvdazure.bench.overhead_workload import time_after_first_step


def test_a_block_leaves_out_its_first_step_and_bookkeeping_is_the_rest_of_each_step():
    total, outside = time_after_first_step([5.0, 1.0, 1.0, 1.0], [4.9, 0.9, 0.8, 0.9])

    assert total == pytest.approx(3.0)
    assert outside == pytest.approx(0.4)
    assert time_after_first_step([5.0, 1.0])[1] is None


def test_summary_takes_the_median_of_per_pair_ratios_and_judges_it_against_the_target():
    seconds = {"hand-written": [1.0, 2.0, 1.0, 1.0, 1.0], "trainer": [1.01, 2.0, 0.99, 1.0, 1.01],
               "trainer, step_times off": [1.0, 1.0, 0.99, 1.0, 1.01]}

    s = overhead.summarize(seconds, [1e-4] * 5, steps=10)

    assert s["ratio_per_pair"] == pytest.approx([1.01, 1.0, 0.99, 1.0, 1.01])
    assert s["ratio_median"] == pytest.approx(1.0)
    assert s["target"]["verdict"] == "met"
    assert s["ms_per_step_median"]["hand-written"] == pytest.approx(100.0)
    assert s["trainer_bookkeeping_us_per_step"]["median"] == pytest.approx(100.0)
    timing = s["step_times"]  # the trainer against itself with step_times off, pair by pair
    assert timing["ratio_per_pair"] == pytest.approx([1.01, 2.0, 1.0, 1.0, 1.0])
    assert timing["ratio_median"] == pytest.approx(1.0)
    assert timing["target"] == {"trainer / step_times off <=": 1.01, "verdict": "undecided"}


def test_every_variant_leads_a_set_of_blocks_in_turn():
    orders = [overhead.block_order(pair) for pair in range(3)]
    assert {order[0] for order in orders} == set(orders[0])
    assert all(sorted(o) == sorted(orders[0]) for o in orders)


def test_the_in_step_timer_times_every_step_of_the_backend_the_binding_passes():
    # was: it hooked `_create_backend`, which the trainers no longer call, so it timed nothing and the
    # benchmark reported the whole step as the trainer's bookkeeping
    import time

    from fakes.fake_backend import FakeTrainer, LinearProblem, ThreadWorld

    from hvdazure import TrainConfig
    from hvdazure.bench.overhead_workload import InStepTimer, StepClock, time_after_first_step

    class SlowStep(FakeTrainer, InStepTimer):  # a binding's trainer, then the timer, as the benchmarks do
        def training_metrics(self, indices):
            time.sleep(0.01)  # inside the backend's run_step
            return {}

    clock = StepClock()
    problem = LinearProblem.make(num_samples=24, num_eval=4, dim=3, seed=1)
    trainer = SlowStep(ThreadWorld(1), 0, problem, TrainConfig(epochs=1, batch_size=4, progress_bar=False),
                       [clock])
    trainer.world.run([trainer.fit])
    assert len(trainer.in_step_s) == len(clock.durations) == 6
    assert all(t >= 0.01 for t in trainer.in_step_s)
    block = time_after_first_step(clock.durations, trainer.in_step_s)
    assert 0.0 <= block.outside_step_s < block.seconds / 2
