"""hvdazure.data.shard_order: the epoch order of a sharded dataset, and SamplePlan following it.

Fake-rank style: every rank's plan is built in this process, so the properties that matter across ranks
(each sample once, the same samples per step at any world size, resume on another world size) are checked
at world sizes 1..8 in well under a second per property.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hvdazure.core.sample_plan import MicroBatch, SamplePlan, UniformOrder
from hvdazure.data.shard_order import ShardOrder

# shard sizes: uneven, shards smaller than a global batch, one shard, empty shards (also first and last)
DATASETS = {
    "uneven": (50, 7, 120, 33, 1, 64, 90, 12),
    "small_shards": (3,) * 40,
    "one_shard": (77,),
    "empty_shards": (0, 10, 0, 25, 0, 8, 0),
    "many_shards": tuple(range(1, 31)),
}
WORLD_SIZES = range(1, 9)
LAYOUTS = [(4, 1), (3, 2), (1, 3)]  # (batch_size, grad_accum_steps)
ORDERS = [{}, {"lanes": 3}, {"lanes": 8, "window": 5}, {"lanes": 1, "window": 1000}]


def _order(name: str, **parameters: int) -> ShardOrder:
    return ShardOrder(DATASETS[name], **parameters)


def _plans(order: ShardOrder, batch_size: int, world_size: int, grad_accum_steps: int = 1,
           seed: int = 0) -> list[SamplePlan]:
    return [SamplePlan(order.num_samples, batch_size, world_size, rank, grad_accum_steps, seed, order)
            for rank in range(world_size)]


def _steps(plans: list[SamplePlan], epoch: int = 0, start_sample: int = 0) -> list[list[MicroBatch]]:
    """Every cell of every step from `start_sample`, each step in (micro-batch, rank) order."""
    per_rank = [list(plan.epoch(epoch, start_sample)) for plan in plans]
    return [[rank_steps[t][k] for k in range(plans[0].grad_accum_steps) for rank_steps in per_rank]
            for t in range(len(per_rank[0]))]


def _step_sets(plans: list[SamplePlan], epoch: int = 0, start_sample: int = 0) -> list[list[int]]:
    return [sorted(i for cell in step for i in cell.indices) for step in _steps(plans, epoch, start_sample)]


def _cases() -> itertools.product[tuple[str, int, tuple[int, int], int]]:
    return itertools.product(DATASETS, WORLD_SIZES, LAYOUTS, range(len(ORDERS)))


def _cells(steps: list[list[MicroBatch]], world_size: int) -> list[list[tuple[int, int, float]]]:
    """Each cell's size, step size and loss weight: what every order must leave as SamplePlan computes it."""
    return [[(len(c.indices), c.step_samples, c.loss_weight(world_size)) for c in step] for step in steps]


def _global_batches(epoch_order: np.ndarray, start_sample: int, global_batch: int) -> list[list[int]]:
    """The samples at positions [s, s + G) of the epoch order, for s = start_sample, start_sample + G, ..."""
    return [sorted(epoch_order[s : s + global_batch].tolist())
            for s in range(start_sample, len(epoch_order), global_batch)]


def _shards_read(order: ShardOrder, plan: SamplePlan, epoch: int = 0) -> set[int]:
    samples = [i for step in plan.epoch(epoch) for cell in step for i in cell.indices]
    return set(order.locate(np.array(samples, dtype=np.int64))[0].tolist())


def test_every_sample_is_used_exactly_once_per_epoch() -> None:
    for name, world_size, (batch, accum), o in _cases():
        order = _order(name, **ORDERS[o])
        used = [i for step in _steps(_plans(order, batch, world_size, accum)) for cell in step
                for i in cell.indices]
        assert sorted(used) == list(range(order.num_samples)), (name, world_size, batch, accum, o)


def test_the_epoch_order_is_a_permutation_held_in_one_int64_array() -> None:
    for name, parameters in itertools.product(DATASETS, ORDERS):
        order = _order(name, **parameters)
        epoch_order = order.epoch_order(seed=1, epoch=4)
        assert epoch_order.dtype == np.int64
        assert sorted(epoch_order.tolist()) == list(range(order.num_samples)), (name, parameters)


def test_each_step_takes_the_next_global_batch_of_the_epoch_order_at_any_world_size() -> None:
    for name, world_size, (batch, accum), o in _cases():
        order = _order(name, **ORDERS[o])
        plans = _plans(order, batch, world_size, accum, seed=2)
        epoch_order = order.epoch_order(seed=2, epoch=1)
        expected = _global_batches(epoch_order, 0, plans[0].global_batch_size)
        assert _step_sets(plans, epoch=1) == expected, (name, world_size, batch, accum, o)


@pytest.mark.parametrize("global_batch", [24, 35])
def test_the_samples_of_each_step_do_not_depend_on_world_size_for_a_fixed_global_batch(
        global_batch: int) -> None:
    layouts = [(b, w, a) for w in WORLD_SIZES for a in (1, 2, 3, 4) for b in (global_batch // (w * a),)
               if b * w * a == global_batch]
    assert len({w for _, w, _ in layouts}) >= 3  # 24: 1, 2, 3, 4, 6, 8 ranks; 35: 1, 5, 7
    for name, parameters in itertools.product(DATASETS, ORDERS):
        order = _order(name, **parameters)
        sets = [_step_sets(_plans(order, b, w, a, seed=3)) for b, w, a in layouts]
        assert all(s == sets[0] for s in sets), (name, parameters)


def test_cell_sizes_and_loss_weights_are_those_of_the_uniform_plan() -> None:
    # the uneven last step, empty cells and the >=2-samples rule are SamplePlan's, whatever the order
    for name, world_size, (batch, accum), o in _cases():
        order = _order(name, **ORDERS[o])
        sharded = _steps(_plans(order, batch, world_size, accum))
        uniform = _steps([SamplePlan(order.num_samples, batch, world_size, rank, accum)
                          for rank in range(world_size)])
        assert _cells(sharded, world_size) == _cells(uniform, world_size), (name, world_size, batch, accum, o)


@pytest.mark.parametrize(("before", "after"), [(1, 2), (2, 1), (3, 5), (8, 3), (4, 7), (6, 6)])
def test_a_resume_at_another_world_size_continues_the_same_order_from_any_sample(before: int,
                                                                                after: int) -> None:
    order = _order("uneven", lanes=4, window=20)
    epoch_order = order.epoch_order(seed=5, epoch=2)
    second = _plans(order, batch_size=3, world_size=after, grad_accum_steps=2, seed=5)
    g = second[0].global_batch_size
    for start_sample in [*range(0, order.num_samples, 11), order.num_samples - 1, order.num_samples]:
        # the first run used positions [0, start_sample) of this order, whatever its world size
        expected = _global_batches(epoch_order, start_sample, g)
        assert _step_sets(second, epoch=2, start_sample=start_sample) == expected, start_sample
        steps = {len(list(plan.epoch(2, start_sample))) for plan in second}
        assert steps == {second[0].steps_left(start_sample)}
    first = _plans(order, batch_size=2, world_size=before, seed=5)
    consumed = 5 * first[0].global_batch_size
    used = [i for step in _steps(first, epoch=2)[:5] for cell in step for i in cell.indices]
    rest = [i for step in _steps(second, epoch=2, start_sample=consumed) for cell in step
            for i in cell.indices]
    assert sorted(used + rest) == list(range(order.num_samples))


def test_the_same_seed_and_epoch_give_the_same_order_from_a_fresh_object() -> None:
    for name, parameters in itertools.product(DATASETS, ORDERS):
        first = _order(name, **parameters).epoch_order(seed=7, epoch=3)
        assert first.tolist() == _order(name, **parameters).epoch_order(seed=7, epoch=3).tolist()
        assert first.tolist() == _order(name, **parameters).epoch_order(seed=7, epoch=3).tolist()


@pytest.mark.parametrize("name", list(DATASETS))
def test_each_epoch_has_its_own_order(name: str) -> None:
    for parameters in ORDERS:
        order = _order(name, **parameters)
        assert len({tuple(order.epoch_order(seed=0, epoch=epoch)) for epoch in range(5)}) == 5, parameters


@pytest.mark.parametrize("name", list(DATASETS))
def test_a_different_seed_gives_a_different_order(name: str) -> None:
    for parameters in ORDERS:
        order = _order(name, **parameters)
        assert len({tuple(order.epoch_order(seed=seed, epoch=0)) for seed in range(5)}) == 5, parameters


def test_the_plan_follows_its_seed() -> None:
    order = _order("uneven")
    assert _steps(_plans(order, 4, 3, seed=1)) == _steps(_plans(order, 4, 3, seed=1))
    assert _steps(_plans(order, 4, 3, seed=1)) != _steps(_plans(order, 4, 3, seed=2))


def test_the_order_of_a_small_dataset_is_pinned() -> None:
    # a checkpoint resumes by position in this order: changing the algorithm must change the "shards/1"
    # version in ShardOrder.fingerprint (and then this expected order)
    order = ShardOrder((5, 0, 7, 3, 9), lanes=4)
    assert order.epoch_order(seed=0, epoch=0).tolist() == [
        12, 19, 4, 11, 15, 21, 1, 6, 14, 20, 3, 9, 13, 18, 0, 10, 17, 23, 2, 7, 16, 22, 5, 8]


def test_locate_maps_global_samples_to_shard_and_offset() -> None:
    order = _order("empty_shards")
    shards, offsets = order.locate(np.arange(order.num_samples))
    expected = [(shard, offset) for shard, size in enumerate(DATASETS["empty_shards"])
                for offset in range(size)]
    assert list(zip(shards.tolist(), offsets.tolist(), strict=True)) == expected
    with pytest.raises(ValueError, match=r"0\.\.42"):
        order.locate(np.array([43]))


def test_locality_each_rank_reads_few_shards_where_the_uniform_order_reads_most() -> None:
    # loose: at most 1.75 x the ideal (shards / world size) plus 2, which the uniform permutation fails
    # from 2 ranks on (it reads every shard on every rank); benchmarks/shard_order_locality.py measures.
    shard_sizes = (40,) * 64
    sharded, uniform = ShardOrder(shard_sizes, lanes=16), UniformOrder(sum(shard_sizes))
    for world_size in WORLD_SIZES:
        bound = 1.75 * len(shard_sizes) / world_size + 2
        for order in (sharded, uniform):
            plans = [SamplePlan(order.num_samples, 8, world_size, rank, order=order)
                     for rank in range(world_size)]
            touched = [len(_shards_read(sharded, plan)) for plan in plans]
            if order is sharded:
                assert max(touched) <= bound, (world_size, touched)
            elif world_size > 1:
                assert min(touched) > bound, (world_size, touched)


def test_at_a_world_size_that_divides_the_lanes_each_rank_reads_the_same_shards_every_epoch() -> None:
    # a node cache holding its ranks' share of the data then serves every epoch after the first
    order = ShardOrder((40,) * 64, lanes=16)
    for world_size in (1, 2, 4, 8, 16):
        plans = [SamplePlan(order.num_samples, 16 // world_size, world_size, rank, order=order)
                 for rank in range(world_size)]
        for plan in plans:
            shards = [_shards_read(order, plan, epoch) for epoch in range(3)]
            assert shards[0] == shards[1] == shards[2]
            assert len(shards[0]) <= len(order.shard_sizes) // world_size + 2, (world_size, len(shards[0]))


def test_the_fingerprint_is_stable_and_changes_with_everything_the_order_depends_on() -> None:
    base = ShardOrder((5, 0, 7), lanes=4, window=3)
    assert base.fingerprint(seed=1) == ShardOrder((5, 0, 7), lanes=4, window=3).fingerprint(seed=1)
    changed = [ShardOrder((5, 0, 8), lanes=4, window=3), ShardOrder((5, 7, 0), lanes=4, window=3),
               ShardOrder((5, 0, 7, 0), lanes=4, window=3), ShardOrder((5, 0, 7), lanes=5, window=3),
               ShardOrder((5, 0, 7), lanes=4, window=4)]
    prints = {base.fingerprint(seed=1), base.fingerprint(seed=2), *(o.fingerprint(seed=1) for o in changed),
              UniformOrder(12).fingerprint(seed=1), UniformOrder(13).fingerprint(seed=1),
              UniformOrder(12).fingerprint(seed=2)}
    assert len(prints) == 10


def test_the_default_window_is_part_of_the_fingerprint_as_resolved() -> None:
    order = ShardOrder((10, 20, 30))
    assert order.window_samples == 40  # twice the mean shard size
    assert order.fingerprint(0) == ShardOrder((10, 20, 30), window=40).fingerprint(0)


def test_the_plans_fingerprint_ignores_world_size_and_batch_size() -> None:
    order = _order("uneven")
    prints = {SamplePlan(order.num_samples, b, w, 0, a, seed=3, order=order).order_fingerprint()
              for b, w, a in [(4, 1, 1), (2, 8, 3), (7, 3, 2)]}
    assert prints == {order.fingerprint(seed=3)}


def test_a_plan_whose_order_covers_another_dataset_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="covers 377 samples but the dataset has num_samples=376"):
        SamplePlan(376, 4, 1, 0, order=_order("uneven"))


@pytest.mark.parametrize(("arguments", "message"), [
    ({"shard_sizes": ()}, "shard_sizes is empty"),
    ({"shard_sizes": (3, -1)}, "shard_sizes must be 0 or more, got -1"),
    ({"shard_sizes": (3,), "lanes": 0}, "lanes must be at least 1, got 0"),
    ({"shard_sizes": (3,), "window": 0}, "window must be at least 1 sample, got 0"),
])
def test_an_order_that_cannot_be_drawn_is_rejected(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ShardOrder(**arguments)  # type: ignore[arg-type]


def test_only_empty_shards_make_an_empty_training_dataset() -> None:
    order = ShardOrder((0, 0))
    assert order.epoch_order(0, 0).tolist() == []
    with pytest.raises(ValueError, match="empty"):
        SamplePlan(order.num_samples, 4, 1, 0, order=order)


def test_an_order_describes_itself_in_the_manifest_with_the_keys_checkpoints_always_had() -> None:
    # checkpoints written before orders described themselves hold exactly these records: they still compare
    from hvdazure.core.checkpoint.trainer_checkpoints import data_order_record

    sharded = SamplePlan(15, 2, 1, 0, seed=3, order=ShardOrder((5, 0, 10), lanes=2, window=4))
    assert data_order_record(sharded, "abc")["order"] == {"seed": 3, "num_samples": 15, "lanes": 2,
                                                          "window": 4, "shards": 3}
    uniform = SamplePlan(15, 2, 1, 0, seed=3)
    assert data_order_record(uniform, None) == {"order_fingerprint": uniform.order_fingerprint(),
                                                "order": {"seed": 3, "num_samples": 15},
                                                "data_fingerprint": None}
