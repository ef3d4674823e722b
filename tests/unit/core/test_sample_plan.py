"""hvdazure.core.sample_plan: which samples each rank uses at each step, and the evaluation split."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hvdazure.core.sample_plan import (
    MicroBatch,
    SamplePlan,
    UniformOrder,
    epoch_permutation,
    eval_range,
    first_eval_batch,
)

# (num_samples, batch_size, world_size, grad_accum_steps): full and partial last steps, steps with more
# cells than samples (empty cells), and a dataset smaller than one micro-batch.
GRID = list(itertools.product((1, 2, 7, 16, 33, 100), (1, 3, 4), (1, 2, 3, 4), (1, 2, 3)))


def _plans(num_samples: int, batch_size: int, world_size: int, grad_accum_steps: int,
           seed: int = 0) -> list[SamplePlan]:
    return [SamplePlan(num_samples, batch_size, world_size, rank, grad_accum_steps, seed)
            for rank in range(world_size)]


def _steps(plans: list[SamplePlan], epoch: int = 0) -> list[list[MicroBatch]]:
    """Every cell of every step, step by step, each step in (micro-batch, rank) order."""
    per_rank = [list(plan.epoch(epoch)) for plan in plans]
    return [[rank_steps[t][k] for k in range(plans[0].grad_accum_steps) for rank_steps in per_rank]
            for t in range(plans[0].steps_per_epoch)]


def test_every_sample_is_used_exactly_once_per_epoch() -> None:
    for case in GRID:
        used = [i for step in _steps(_plans(*case)) for cell in step for i in cell.indices]
        assert sorted(used) == list(range(case[0])), case


def test_every_rank_runs_the_same_steps_with_one_micro_batch_per_accumulation_step() -> None:
    for case in GRID:
        plans = _plans(*case)
        assert len({plan.steps_per_epoch for plan in plans}) == 1, case
        for plan in plans:
            steps = list(plan.epoch(0))
            assert len(steps) == plan.steps_per_epoch, case
            assert all(len(step) == plan.grad_accum_steps for step in steps), case


def test_steps_per_epoch_counts_a_partial_last_step() -> None:
    for num_samples, batch_size, world_size, grad_accum_steps in GRID:
        plan = SamplePlan(num_samples, batch_size, world_size, 0, grad_accum_steps)
        global_batch = batch_size * world_size * grad_accum_steps
        assert plan.global_batch_size == global_batch
        assert plan.steps_per_epoch == (num_samples + global_batch - 1) // global_batch


@pytest.mark.parametrize("num_samples", [1, 7, 8, 23, 64, 100])
def test_the_samples_of_each_step_do_not_depend_on_world_size_for_a_fixed_global_batch(
        num_samples: int) -> None:
    # global batch 8 throughout: (batch_size, world_size, grad_accum_steps)
    layouts = [(8, 1, 1), (4, 2, 1), (2, 4, 1), (2, 2, 2), (1, 2, 4), (2, 1, 4)]
    sample_sets = [[sorted(i for cell in step for i in cell.indices)
                    for step in _steps(_plans(num_samples, b, w, a, seed=3))] for b, w, a in layouts]
    assert all(sets == sample_sets[0] for sets in sample_sets), sample_sets


def test_cells_take_consecutive_positions_of_the_epoch_order_in_micro_batch_then_rank_order() -> None:
    for case in GRID:
        plans = _plans(*case, seed=5)
        order = epoch_permutation(case[0], seed=5, epoch=2).tolist()
        flattened = [i for step in _steps(plans, epoch=2) for cell in step for i in cell.indices]
        assert flattened == order, case


def test_a_full_step_gives_every_cell_exactly_batch_size_samples() -> None:
    steps = _steps(_plans(num_samples=48, batch_size=4, world_size=3, grad_accum_steps=2))
    assert len(steps) == 2
    assert all(len(cell.indices) == 4 for step in steps for cell in step)


def test_the_cells_that_get_samples_are_split_as_evenly_as_possible() -> None:
    for case in GRID:
        for step in _steps(_plans(*case)):
            sizes = [len(cell.indices) for cell in step if not cell.is_empty]
            assert max(sizes) - min(sizes) <= 1, (case, sizes)


def test_no_cell_gets_more_than_batch_size_samples() -> None:
    for case in GRID:
        assert all(len(cell.indices) <= case[1] for step in _steps(_plans(*case)) for cell in step), case


def test_a_short_step_gives_each_cell_at_least_two_samples_where_the_batch_size_allows() -> None:
    # BatchNorm cannot train on one sample: 5 samples over 4 ranks go 3 + 2, not 2 + 1 + 1 + 1
    steps = _steps(_plans(num_samples=21, batch_size=4, world_size=4, grad_accum_steps=1))
    assert [len(cell.indices) for cell in steps[-1]] == [3, 2, 0, 0]
    for case in GRID:
        batch_size = case[1]
        for step in _steps(_plans(*case)):
            sizes = [len(cell.indices) for cell in step if not cell.is_empty]
            if min(sizes) == 1:  # only when unavoidable: one sample in the step, or cells of 1 or 2
                assert sum(sizes) == 1 or batch_size <= 2, (case, sizes)


def test_the_last_step_keeps_the_remainder_without_padding() -> None:
    # 10 samples, global batch 8: one full step, then the 2 left over go to one rank (not 1 + 1)
    steps = _steps(_plans(num_samples=10, batch_size=4, world_size=2, grad_accum_steps=1))
    assert [[len(cell.indices) for cell in step] for step in steps] == [[4, 4], [2, 0]]
    assert all(cell.step_samples == 2 for cell in steps[1])


def test_loss_weights_sum_to_one_over_all_ranks_and_micro_batches() -> None:
    for case in GRID:
        for step in _steps(_plans(*case)):
            assert sum(cell.loss_weight(1) for cell in step) == pytest.approx(1.0), case


def test_loss_weight_is_the_cells_share_of_the_steps_samples_times_the_ranks_averaged() -> None:
    assert MicroBatch(indices=[4, 9, 1], step_samples=12).loss_weight(1) == 0.25
    assert MicroBatch(indices=[4, 9, 1], step_samples=12).loss_weight(2) == 0.5


@pytest.mark.parametrize("world_size", range(1, 200))
def test_a_full_step_without_accumulation_has_a_loss_weight_of_exactly_one(world_size: int) -> None:
    # was: len / step_samples * world_size, which is 0.9999999999999999 for 49 ranks (and 98, 103, ...)
    for batch_size in (1, 3, 32):
        cell = MicroBatch(indices=list(range(batch_size)), step_samples=batch_size * world_size)
        assert cell.loss_weight(world_size) == 1.0


def test_a_rank_can_get_an_empty_cell_with_loss_weight_zero() -> None:
    # 3 samples over 4 ranks with batch 2: two cells of 2 and 1, two ranks run the step on nothing
    cells = [plan.step(0, 0)[0] for plan in _plans(num_samples=3, batch_size=2, world_size=4,
                                                   grad_accum_steps=1)]
    assert [len(cell.indices) for cell in cells] == [2, 1, 0, 0]
    assert cells[3].is_empty
    assert cells[3].loss_weight(4) == 0.0
    assert not cells[0].is_empty


@pytest.mark.parametrize(("num_samples", "batch_size", "world_size", "start", "smallest"), [
    (33, 4, 2, 0, 1),    # 33 = 4 x 8 + 1: the last step holds one sample
    (37, 4, 2, 0, 2),    # 5 left: 3 + 2
    (32, 4, 2, 0, 4),    # no short step
    (33, 4, 2, 30, 3),   # a resumed epoch from sample 30: 3 left, in one cell
    (3, 1, 4, 0, 1),
])
def test_smallest_micro_batch_is_that_of_the_short_last_step(num_samples: int, batch_size: int,
                                                             world_size: int, start: int,
                                                             smallest: int) -> None:
    plan = SamplePlan(num_samples, batch_size, world_size, 0)
    assert plan.smallest_micro_batch(start) == smallest
    sizes = [len(cell.indices) for step in _steps(_plans(num_samples, batch_size, world_size, 1))
             for cell in step if not cell.is_empty]
    if start == 0:
        assert min(sizes) == smallest


@pytest.mark.parametrize(("num_samples", "batch_size", "world_size", "accum"), [
    (37, 4, 2, 1), (35, 4, 2, 1), (33, 4, 2, 1), (10, 1, 2, 1), (11, 1, 2, 1), (11, 1, 3, 1), (37, 2, 2, 2),
    (23, 3, 2, 3), (32, 4, 2, 1), (5, 4, 4, 2),
])
def test_smallest_micro_batch_across_ranks_is_the_fewest_samples_of_one_micro_batch_of_all_ranks(
        num_samples: int, batch_size: int, world_size: int, accum: int) -> None:
    plans = _plans(num_samples, batch_size, world_size, accum)
    groups = [sum(len(cell.indices) for cell in step[k * world_size : (k + 1) * world_size])
              for step in _steps(plans) for k in range(accum)]
    assert plans[0].smallest_micro_batch(across_ranks=True) == min(g for g in groups if g)


def test_one_sample_per_rank_is_no_one_sample_micro_batch_across_ranks() -> None:
    assert SamplePlan(10, 1, 2, 0).smallest_micro_batch(across_ranks=True) == 2
    assert SamplePlan(11, 1, 2, 0).smallest_micro_batch(across_ranks=True) == 1  # the last step: 1 sample
    assert SamplePlan(11, 1, 2, 0).nearest_batch_sizes(2, across_ranks=True) == [2, 3]


def test_nearest_batch_sizes_avoid_a_micro_batch_of_one() -> None:
    plan = SamplePlan(33, 4, 2, 0)
    assert plan.nearest_batch_sizes(min_micro_batch=2) == [3, 5]
    for batch_size in plan.nearest_batch_sizes(min_micro_batch=2):
        assert SamplePlan(33, batch_size, 2, 0).smallest_micro_batch() >= 2


def test_the_same_seed_and_epoch_give_the_same_order() -> None:
    assert epoch_permutation(50, seed=7, epoch=3).tolist() == epoch_permutation(50, seed=7, epoch=3).tolist()


def test_each_epoch_has_its_own_order() -> None:
    orders = {tuple(epoch_permutation(50, seed=7, epoch=epoch)) for epoch in range(5)}
    assert len(orders) == 5


def test_a_different_seed_gives_a_different_order() -> None:
    assert epoch_permutation(50, seed=1, epoch=0).tolist() != epoch_permutation(50, seed=2, epoch=0).tolist()


def test_the_epoch_order_is_a_permutation_of_the_dataset() -> None:
    assert sorted(epoch_permutation(37, seed=0, epoch=0).tolist()) == list(range(37))


def test_the_plan_follows_its_seed() -> None:
    first = _steps(_plans(40, 2, 2, 1, seed=1))
    assert first == _steps(_plans(40, 2, 2, 1, seed=1))
    assert first != _steps(_plans(40, 2, 2, 1, seed=2))


@pytest.mark.parametrize("start_step", [0, 1, 3, 6])
def test_resuming_at_a_step_boundary_yields_the_rest_of_the_same_epoch(start_step: int) -> None:
    plan = SamplePlan(num_samples=45, batch_size=2, world_size=2, rank=1, grad_accum_steps=2, seed=4)
    assert plan.steps_per_epoch == 6
    start_sample = min(start_step * plan.global_batch_size, plan.num_samples)  # the end of the epoch is n
    assert list(plan.epoch(2, start_sample=start_sample)) == list(plan.epoch(2))[start_step:]
    assert plan.steps_left(start_sample) == plan.steps_per_epoch - start_step


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (2, 3), (4, 2)])
def test_resuming_with_another_world_size_uses_each_remaining_sample_exactly_once(before: int,
                                                                                  after: int) -> None:
    n, batch = 45, 2
    first = [SamplePlan(n, batch, before, r, seed=3) for r in range(before)]
    consumed_steps = 3
    used = {i for plan in first for step in list(plan.epoch(5))[:consumed_steps] for mb in step
            for i in mb.indices}
    position = consumed_steps * first[0].global_batch_size
    assert used == set(epoch_permutation(n, 3, 5)[:position].tolist())

    second = [SamplePlan(n, batch, after, r, seed=3) for r in range(after)]
    rest = [i for plan in second for step in plan.epoch(5, start_sample=position) for mb in step
            for i in mb.indices]
    assert sorted(rest) == sorted(set(range(n)) - used)
    assert len({len(list(plan.epoch(5, start_sample=position))) for plan in second}) == 1
    assert second[0].steps_left(position) == len(list(second[0].epoch(5, start_sample=position)))


def test_one_step_is_the_same_as_that_step_of_the_epoch() -> None:
    plan = SamplePlan(num_samples=45, batch_size=2, world_size=2, rank=1, grad_accum_steps=2, seed=4)
    full = list(plan.epoch(1))
    assert [plan.step(1, t) for t in range(plan.steps_per_epoch)] == full


def test_eval_ranges_partition_the_dataset_contiguously_in_rank_order() -> None:
    for num_samples, world_size in itertools.product(range(0, 30), range(1, 9)):
        ranges = [eval_range(num_samples, world_size, rank) for rank in range(world_size)]
        assert [i for r in ranges for i in r] == list(range(num_samples)), (num_samples, world_size)
        assert all(r.step == 1 for r in ranges)


def test_eval_range_sizes_differ_by_at_most_one() -> None:
    for num_samples, world_size in itertools.product(range(0, 30), range(1, 9)):
        sizes = [len(eval_range(num_samples, world_size, rank)) for rank in range(world_size)]
        assert max(sizes) - min(sizes) <= 1, (num_samples, world_size, sizes)


@pytest.mark.parametrize("num_samples", [0, -1])
def test_an_empty_training_dataset_is_rejected(num_samples: int) -> None:
    with pytest.raises(ValueError, match="empty"):
        SamplePlan(num_samples=num_samples, batch_size=4, world_size=1, rank=0)


@pytest.mark.parametrize(("rank", "world_size"), [(-1, 2), (2, 2), (5, 2)])
def test_a_rank_outside_the_world_is_rejected(rank: int, world_size: int) -> None:
    with pytest.raises(ValueError, match=f"rank {rank}"):
        SamplePlan(num_samples=10, batch_size=4, world_size=world_size, rank=rank)


def test_an_empty_world_is_rejected() -> None:
    with pytest.raises(ValueError, match="world_size must be at least 1, got 0"):
        SamplePlan(num_samples=10, batch_size=4, world_size=0, rank=0)


def test_a_step_past_the_end_of_the_epoch_is_rejected() -> None:
    plan = SamplePlan(num_samples=10, batch_size=4, world_size=1, rank=0)
    with pytest.raises(ValueError, match=r"step 3 is not in 0\.\.2"):
        plan.step(epoch=0, step=3)


@pytest.mark.parametrize(("batch_size", "grad_accum_steps"), [(0, 1), (-2, 1), (4, 0)])
def test_a_batch_without_samples_is_rejected(batch_size: int, grad_accum_steps: int) -> None:
    with pytest.raises(ValueError):
        SamplePlan(num_samples=10, batch_size=batch_size, world_size=1, rank=0,
                  grad_accum_steps=grad_accum_steps)


@pytest.mark.parametrize("rank", [-1, 2])
def test_eval_range_rejects_a_rank_outside_the_world(rank: int) -> None:
    with pytest.raises(ValueError, match=f"rank {rank}"):
        eval_range(10, world_size=2, rank=rank)


def test_the_default_order_is_the_uniform_permutation_bit_for_bit() -> None:
    for case in GRID:
        explicit = [SamplePlan(*case[:2], case[2], rank, case[3], 5, order=UniformOrder(case[0]))
                    for rank in range(case[2])]
        assert _steps(explicit, epoch=2) == _steps(_plans(*case, seed=5), epoch=2), case
        assert UniformOrder(case[0]).epoch_order(5, 2).tolist() == epoch_permutation(case[0], 5, 2).tolist()


class _SortedOrder:
    """An order that groups a step by sorting it: shows where SamplePlan puts a grouped step's samples."""

    def __init__(self, num_samples: int) -> None:
        self.num_samples = num_samples

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        return epoch_permutation(self.num_samples, seed, epoch)

    def group_for_reading(self, samples: np.ndarray, seed: int) -> np.ndarray | None:
        return np.sort(samples)

    def fingerprint(self, seed: int) -> str:
        return "sorted"

    def describe(self) -> dict[str, int]:
        return {}


def test_a_grouped_step_gives_each_rank_one_stretch_dealt_in_turn_to_its_micro_batches() -> None:
    # global batch 12 = 2 per micro-batch x 3 ranks x 2 micro-batches: rank r takes the r-th 4 of the
    # sorted step, and its micro-batches take every other one of them
    order = _SortedOrder(12)
    plans = [SamplePlan(12, 2, 3, rank, 2, order=order) for rank in range(3)]
    step = sorted(epoch_permutation(12, 0, 0).tolist())
    assert [[mb.indices for mb in plan.step(0, 0)] for plan in plans] == [
        [[step[0], step[2]], [step[1], step[3]]], [[step[4], step[6]], [step[5], step[7]]],
        [[step[8], step[10]], [step[9], step[11]]]]


def test_a_grouped_step_keeps_the_uniform_plans_cell_sizes_and_loss_weights() -> None:
    for case in GRID:
        grouped = [SamplePlan(*case[:2], case[2], rank, case[3], order=_SortedOrder(case[0]))
                   for rank in range(case[2])]
        sizes = [[(len(cell.indices), cell.step_samples) for cell in step] for step in _steps(grouped)]
        assert sizes == [[(len(cell.indices), cell.step_samples) for cell in step]
                         for step in _steps(_plans(*case))], case
        used = [i for step in _steps(grouped) for cell in step for i in cell.indices]
        assert sorted(used) == list(range(case[0])), case


def test_a_plan_whose_order_covers_another_dataset_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="covers 11 samples but the dataset has num_samples=10"):
        SamplePlan(num_samples=10, batch_size=4, world_size=1, rank=0, order=UniformOrder(11))


def test_the_order_fingerprint_names_the_order_and_seed_not_the_world_or_batch() -> None:
    prints = {SamplePlan(40, b, w, 0, a, seed=3).order_fingerprint() for b, w, a in [(4, 1, 1), (2, 8, 3)]}
    assert prints == {UniformOrder(40).fingerprint(seed=3)}
    assert UniformOrder(40).fingerprint(seed=3) != UniformOrder(40).fingerprint(seed=4)
    assert UniformOrder(40).fingerprint(seed=3) != UniformOrder(41).fingerprint(seed=3)


@pytest.mark.parametrize(("num_samples", "batch_size", "world_size", "rank", "expected"), [
    (10, 3, 2, 1, range(5, 8)),  # this rank's first batch
    (10, 8, 2, 1, range(5, 10)),  # its whole share, smaller than a batch
    (2, 4, 3, 2, range(0, 2)),  # no share of its own: the set's first batch
    (0, 4, 2, 0, range(0, 0)),  # an empty set
])
def test_the_sanity_check_batch_is_the_ranks_first_or_the_sets_first_where_it_has_none(
        num_samples: int, batch_size: int, world_size: int, rank: int, expected: range) -> None:
    assert first_eval_batch(num_samples, batch_size, world_size, rank) == expected
