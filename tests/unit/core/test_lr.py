"""hvdazure.core.lr: LR scaling for the global batch, Goyal et al. (2017) warmup, then the schedule."""

from __future__ import annotations

import itertools
import math

import pytest

from hvdazure.core.config import TrainConfig
from hvdazure.core.lr import LRSchedule, scaled_lr, warmup_epochs_to_steps
from hvdazure.core.sample_plan import SamplePlan

LR = 0.1


def _schedule(world_size: int = 1, steps_per_epoch: int = 10, **config: object) -> LRSchedule:
    return LRSchedule.from_config(TrainConfig(**{"lr": LR, "batch_size": 8, **config}), world_size,
                                  steps_per_epoch)


@pytest.mark.parametrize(("scaling", "expected"), [("linear", 0.4), ("sqrt", 0.2), ("none", 0.1)])
def test_scaled_lr_applies_the_scaling_rule_to_the_batch_ratio(scaling: str, expected: float) -> None:
    lr = scaled_lr(0.1, global_batch_size=128, base_batch_size=32, scaling=scaling)
    assert lr == pytest.approx(expected)


def test_scaled_lr_rejects_an_unknown_rule() -> None:
    with pytest.raises(ValueError, match="'cubic'"):
        scaled_lr(0.1, 64, 32, "cubic")


@pytest.mark.parametrize("grad_accum_steps", [1, 2, 4])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_linear_scaling_multiplies_the_lr_by_ranks_times_accumulation(world_size: int,
                                                                       grad_accum_steps: int) -> None:
    schedule = _schedule(world_size, grad_accum_steps=grad_accum_steps, lr_scaling="linear")
    assert schedule.peak_lr == pytest.approx(LR * world_size * grad_accum_steps)


@pytest.mark.parametrize("grad_accum_steps", [1, 2, 4])
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_sqrt_scaling_multiplies_the_lr_by_the_root_of_ranks_times_accumulation(
        world_size: int, grad_accum_steps: int) -> None:
    schedule = _schedule(world_size, grad_accum_steps=grad_accum_steps, lr_scaling="sqrt")
    assert schedule.peak_lr == pytest.approx(LR * math.sqrt(world_size * grad_accum_steps))


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_no_scaling_keeps_the_configured_lr(world_size: int) -> None:
    assert _schedule(world_size, lr_scaling="none", grad_accum_steps=2).peak_lr == LR


def test_base_batch_size_is_the_batch_the_lr_was_tuned_for() -> None:
    # global batch 8 x 4 = 32, tuned for 16: twice the LR
    assert _schedule(world_size=4, base_batch_size=16).peak_lr == pytest.approx(2 * LR)


@pytest.mark.parametrize(("batch_size", "world_size", "grad_accum_steps"),
                         [(64, 1, 1), (32, 2, 1), (8, 4, 2)])
def test_the_lr_at_every_step_depends_only_on_the_global_batch(batch_size: int, world_size: int,
                                                                grad_accum_steps: int) -> None:
    config = TrainConfig(lr=LR, batch_size=batch_size, grad_accum_steps=grad_accum_steps, base_batch_size=16,
                         epochs=3, warmup_epochs=1, schedule="cosine")
    plan = SamplePlan(1000, batch_size, world_size, 0, grad_accum_steps)
    schedule = LRSchedule.from_config(config, world_size, plan.steps_per_epoch)
    reference = LRSchedule.from_config(config.replace(batch_size=64, grad_accum_steps=1), 1, 16)
    assert [schedule.lr_at(t) for t in range(48)] == pytest.approx([reference.lr_at(t) for t in range(48)])


def test_warmup_starts_at_the_configured_lr() -> None:
    assert _schedule(world_size=4, warmup_steps=20).lr_at(0) == LR


def test_warmup_rises_linearly_to_the_scaled_lr() -> None:
    schedule = _schedule(world_size=4, warmup_steps=20)
    peak = 4 * LR
    expected = [LR + (peak - LR) * t / 20 for t in range(20)]
    assert [schedule.lr_at(t) for t in range(20)] == pytest.approx(expected)


def test_warmup_is_halfway_at_its_midpoint() -> None:
    assert _schedule(world_size=4, warmup_steps=20).lr_at(10) == pytest.approx((LR + 4 * LR) / 2)


def test_warmup_ends_at_the_scaled_lr() -> None:
    assert _schedule(world_size=4, warmup_steps=20).lr_at(20) == pytest.approx(4 * LR)


def test_without_warmup_the_first_step_uses_the_scaled_lr() -> None:
    assert _schedule(world_size=4).lr_at(0) == pytest.approx(4 * LR)


@pytest.mark.parametrize(("warmup_epochs", "steps_per_epoch", "warmup_steps"), [(2, 10, 20), (0.5, 10, 5),
                                                                                (1.5, 4, 6), (0, 10, 0)])
def test_warmup_epochs_are_converted_with_the_steps_per_epoch(warmup_epochs: float, steps_per_epoch: int,
                                                               warmup_steps: int) -> None:
    schedule = _schedule(steps_per_epoch=steps_per_epoch, warmup_epochs=warmup_epochs)
    assert schedule.warmup_steps == warmup_steps


def test_warmup_is_counted_in_optimizer_steps_not_micro_batches() -> None:
    schedule = _schedule(world_size=2, grad_accum_steps=4, warmup_steps=10)
    assert schedule.warmup_steps == 10
    assert schedule.lr_at(10) == pytest.approx(LR * 2 * 4)


@pytest.mark.parametrize("step", [0, 5, 999])
def test_constant_schedule_holds_the_scaled_lr_after_warmup(step: int) -> None:
    assert _schedule(world_size=2, schedule="constant").lr_at(step) == pytest.approx(2 * LR)


def _cosine(**config: object) -> LRSchedule:
    # 2 ranks: peak 0.2 and floor 0.02; 10 warmup steps, then 40 steps of cosine
    return _schedule(world_size=2, epochs=5, steps_per_epoch=10, warmup_steps=10, schedule="cosine",
                     min_lr=0.01, **config)


def test_cosine_starts_at_the_scaled_lr_when_warmup_ends() -> None:
    assert _cosine().lr_at(10) == pytest.approx(0.2)


def test_cosine_is_halfway_between_peak_and_floor_at_its_midpoint() -> None:
    assert _cosine().lr_at(30) == pytest.approx((0.2 + 0.02) / 2)


def test_cosine_reaches_the_floor_at_the_last_step_and_stays_there() -> None:
    schedule = _cosine()
    assert schedule.total_steps == 50
    assert schedule.lr_at(50) == pytest.approx(0.02)
    assert schedule.lr_at(80) == pytest.approx(0.02)


def test_cosine_floor_is_scaled_like_the_lr() -> None:
    assert _cosine().min_lr == pytest.approx(0.01 * 2)


def test_cosine_never_rises_after_warmup() -> None:
    values = [_cosine().lr_at(t) for t in range(10, 51)]
    assert all(later <= earlier for earlier, later in itertools.pairwise(values))


def test_cosine_ends_at_max_steps_when_that_comes_first() -> None:
    schedule = _cosine(max_steps=30)
    assert schedule.lr_at(20) == pytest.approx((0.2 + 0.02) / 2)
    assert schedule.lr_at(30) == pytest.approx(0.02)


@pytest.mark.parametrize(("step", "decays"), [(0, 0), (19, 0), (20, 1), (39, 1), (40, 2), (59, 2), (60, 3)])
def test_step_schedule_multiplies_by_gamma_every_step_size_epochs(step: int, decays: int) -> None:
    schedule = _schedule(world_size=2, steps_per_epoch=10, epochs=8, schedule="step", step_size_epochs=2,
                         step_gamma=0.5)
    assert schedule.lr_at(step) == pytest.approx(2 * LR * 0.5**decays)


def test_total_steps_are_epochs_times_steps_per_epoch() -> None:
    assert _schedule(epochs=3, steps_per_epoch=7).total_steps == 21


def test_max_steps_caps_total_steps() -> None:
    assert _schedule(epochs=3, steps_per_epoch=7, max_steps=10).total_steps == 10


def test_max_steps_beyond_the_epochs_does_not_extend_training() -> None:
    assert _schedule(epochs=3, steps_per_epoch=7, max_steps=100).total_steps == 21


def test_an_unknown_schedule_is_rejected() -> None:
    schedule = LRSchedule(start_lr=0.1, peak_lr=0.1, warmup_steps=0, total_steps=10, steps_per_epoch=5,
                          schedule="exponential")
    with pytest.raises(ValueError, match="'exponential'"):
        schedule.lr_at(0)


@pytest.mark.parametrize(("warmup_epochs", "steps_per_epoch", "steps"), [
    (1.1, 50, 55),   # was 56: 1.1 x 50 is 55.000000000000007 in binary floating point
    (0.3, 10, 3),    # 0.3 x 10 = 3.0000000000000004
    (0.7, 10, 7),
    (0.25, 10, 3),   # a true fraction still rounds up
])
def test_warmup_epochs_convert_to_the_exact_number_of_steps(warmup_epochs: float, steps_per_epoch: int,
                                                            steps: int) -> None:
    assert warmup_epochs_to_steps(warmup_epochs, steps_per_epoch) == steps
    assert _schedule(warmup_epochs=warmup_epochs, steps_per_epoch=steps_per_epoch).warmup_steps == steps
