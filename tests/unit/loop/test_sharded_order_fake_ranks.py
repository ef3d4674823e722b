"""Sharded data's order (data/shard_order.py's ShardOrder) through the real training loop, on 1..8 ranks
simulated by threads (tests/fakes/fake_backend.py), and what a checkpoint records of it.

The fake backend trains a float64 linear regression whose samples stand for a sharded dataset's: the
backend hands the loop a ShardOrder, as a binding does for a ShardedDataset. Checked: every sample once per
epoch; the same step sets at any world size; parameters equal to single-process SGD over the epoch order;
a resume at another world size continues exactly; the shards each rank touches per epoch against the ideal
ceil(shards / world size); and a resume across a change of the order or of the data is refused on every
rank, while a checkpoint from before these were recorded resumes as before.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from fakes.fake_backend import FakeTrainer, LinearProblem, ThreadWorld, initial_weights

from hvdazure.core import training_loop as core_trainer
from hvdazure.core.checkpoint.store import CheckpointError
from hvdazure.core.config import TrainConfig
from hvdazure.core.sample_plan import SampleOrder
from hvdazure.data.shard_order import ShardOrder

Trainers = list[FakeTrainer]

# shard sizes: uneven, shards smaller than a global batch, one shard, an empty shard (first and inside)
DATASETS = {
    "uneven": (50, 7, 120, 33, 1, 64, 90, 12),
    "small_shards": (3,) * 40,
    "one_shard": (77,),
    "empty_shard": (0, 10, 25, 0, 14),  # 49 samples: a global batch of up to 48 (8 ranks x 3 x 2), and 1
}
WORLD_SIZES = range(1, 9)


# --- helpers ----------------------------------------------------------------------------------------------
def config(**fields: object) -> TrainConfig:
    return TrainConfig(**{"lr": 0.05, "progress_bar": False, "log_every": 2, "checkpoint_dir": None,
                          **fields})  # type: ignore[arg-type]


def fit(world_size: int, order: SampleOrder, cfg: TrainConfig, problem: LinearProblem | None = None,
        data_fingerprint: str | None = "index-1") -> Trainers:
    problem = problem or LinearProblem.make(order.num_samples)
    world = ThreadWorld(world_size)
    trainers = [FakeTrainer(world, rank, problem, cfg, order=order, data_fingerprint=data_fingerprint)
                for rank in range(world_size)]
    world.run([trainer.fit for trainer in trainers])
    return trainers


def step_sets(trainers: Trainers) -> list[list[int]]:
    """Each optimizer step's samples over all ranks, sorted."""
    steps = zip(*(trainer.steps for trainer in trainers), strict=True)
    return [sorted(i for record in step for cell in record.micro_batches for i in cell) for step in steps]


def samples_by_epoch(*runs: Trainers) -> dict[int, Counter]:
    used: dict[int, Counter] = {}
    for trainers in runs:
        for trainer in trainers:
            for record in trainer.steps:
                cells = record.micro_batches
                used.setdefault(record.epoch, Counter()).update(i for cell in cells for i in cell)
    return used


def reference_sgd(problem: LinearProblem, order: SampleOrder, epochs: int, global_batch: int, lr: float,
                  seed: int = 0) -> np.ndarray:
    """Single-process SGD (constant LR) over global batches of the order's epoch order."""
    w = initial_weights(problem.dim, seed, rank=0)
    for epoch in range(epochs):
        samples = order.epoch_order(seed, epoch)
        for start in range(0, len(samples), global_batch):
            w = w - lr * problem.loss_and_gradient(w, samples[start : start + global_batch].tolist())[1]
    return w


def shards_touched(order: ShardOrder, trainer: FakeTrainer, epoch: int) -> int:
    samples = [i for record in trainer.steps if record.epoch == epoch for cell in record.micro_batches
               for i in cell]
    return len(set(order.locate(np.array(samples, dtype=np.int64))[0].tolist()))


# --- the order through the loop ---------------------------------------------------------------------------
@pytest.mark.parametrize("dataset", DATASETS)
def test_every_sample_is_trained_on_once_per_epoch_at_any_world_size_with_accumulation(dataset: str) -> None:
    order = ShardOrder(DATASETS[dataset], lanes=4)
    for world_size, accum in itertools.product(WORLD_SIZES, (1, 3)):
        trainers = fit(world_size, order, config(epochs=2, batch_size=2, grad_accum_steps=accum))
        used = samples_by_epoch(trainers)
        assert sorted(used) == [0, 1]
        for epoch, counts in used.items():
            assert counts == Counter(range(order.num_samples)), (dataset, world_size, accum, epoch)


@pytest.mark.parametrize("dataset", DATASETS)
def test_the_samples_of_each_step_are_the_same_at_any_world_size_and_sgd_matches_one_process(
        dataset: str) -> None:
    # global batch 24 as (ranks, batch, accumulation): 1 x 24, 2 x 6 x 2, 3 x 8, 4 x 6, 6 x 2 x 2, 8 x 3
    layouts = [(1, 24, 1), (2, 6, 2), (3, 8, 1), (4, 6, 1), (6, 2, 2), (8, 3, 1)]
    order = ShardOrder(DATASETS[dataset], lanes=4, window=9)
    problem = LinearProblem.make(order.num_samples)
    expected = reference_sgd(problem, order, epochs=2, global_batch=24, lr=0.05, seed=3)
    runs = [fit(w, order, config(epochs=2, batch_size=b, grad_accum_steps=a, base_batch_size=24, seed=3),
                problem) for w, b, a in layouts]

    sets = [step_sets(trainers) for trainers in runs]
    assert all(s == sets[0] for s in sets), dataset
    for (world_size, _, _), trainers in zip(layouts, runs, strict=True):
        np.testing.assert_allclose(trainers[0].weights, expected, rtol=0, atol=1e-12, err_msg=str(world_size))


@pytest.mark.parametrize(("before", "after"), [(1, 4), (4, 1), (3, 5), (8, 2), (2, 7)])
def test_a_resume_at_another_world_size_continues_the_sharded_order_exactly(before: int, after: int,
                                                                            checkpoint_dir: str) -> None:
    # global batch 24 before and after (base_batch_size 24: the LR stays 0.05); 3 epochs of 420 samples,
    # 18 steps each
    order = ShardOrder(DATASETS["uneven"] + DATASETS["empty_shard"], lanes=8)
    problem = LinearProblem.make(order.num_samples)
    layout = {1: (24, 1), 2: (12, 1), 3: (8, 1), 4: (3, 2), 5: None, 7: None, 8: (3, 1)}
    cfg = config(epochs=3, base_batch_size=24, checkpoint_dir=checkpoint_dir)

    def run_config(world_size: int, **fields: object) -> TrainConfig:
        batch, accum = layout[world_size] or (5, 1)  # 5 and 7 ranks: another global batch (35)
        return cfg.replace(batch_size=batch, grad_accum_steps=accum, **fields)

    first = fit(before, order, run_config(before, max_steps=22), problem)  # 4 steps into epoch 2
    assert first[0].state.epoch == 1 and first[0].state.samples_in_epoch > 0
    second = fit(after, order, run_config(after, resume="auto"), problem)

    used = samples_by_epoch(first, second)
    assert all(used[epoch] == Counter(range(order.num_samples)) for epoch in range(3))
    if layout[after] is not None:  # the same global batch: the parameters of the uninterrupted run
        expected = reference_sgd(problem, order, epochs=3, global_batch=24, lr=0.05)
        np.testing.assert_allclose(second[0].weights, expected, rtol=0, atol=1e-12)


# shards touched per rank per epoch: 64 uneven shards (20..60 samples), global batch 64
LOCALITY_SHARDS = tuple(20 + (7 * k) % 41 for k in range(64))


def measure_shards_touched(lanes: int, world_size: int, epochs: int = 2) -> list[list[int]]:
    """Shards each rank read in each epoch, [epoch][rank], through the real loop."""
    order = ShardOrder(LOCALITY_SHARDS, lanes=lanes)
    trainers = fit(world_size, order, config(epochs=epochs, batch_size=64 // world_size))
    return [[shards_touched(order, trainer, epoch) for trainer in trainers] for epoch in range(epochs)]


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_where_lanes_are_a_multiple_of_the_world_size_each_rank_touches_near_its_ideal_share_of_shards(
        world_size: int) -> None:
    # ideal: ceil(shards / world size), each shard read whole by one rank. Measured (64 shards, 32 lanes,
    # most per rank): 64, 35, 21, 13 at 1, 2, 4, 8 ranks against 64, 32, 16, 8. Each of a rank's lanes can
    # share a shard with its neighbour lane, and the epoch's short last step is grouped afresh: 2 more.
    ideal = math.ceil(len(LOCALITY_SHARDS) / world_size)
    lanes_per_rank = 32 // world_size
    for epoch, touched in enumerate(measure_shards_touched(32, world_size)):
        assert max(touched) <= ideal + lanes_per_rank + 2, (world_size, epoch, touched, ideal)
        assert sum(touched) <= len(LOCALITY_SHARDS) + 32, (world_size, epoch, touched)  # reads in all


def test_shards_touched_per_rank_are_reported_against_the_ideal(capsys: pytest.CaptureFixture[str]) -> None:
    """Not a bound: prints the numbers (pytest -s) for world sizes 1..8 with 32 and 16 lanes."""
    rows = []
    for lanes, world_size in itertools.product((32, 16), WORLD_SIZES):
        touched = measure_shards_touched(lanes, world_size, epochs=1)[0]
        ideal = math.ceil(len(LOCALITY_SHARDS) / world_size)
        rows.append(f"lanes {lanes:2d} world {world_size}: max {max(touched):2d} mean "
                    f"{sum(touched) / world_size:5.1f} ideal {ideal:2d} ratio {max(touched) / ideal:.2f}")
        assert max(touched) <= len(LOCALITY_SHARDS)
    with capsys.disabled():
        print("\nshards touched per rank per epoch (64 shards):\n" + "\n".join(rows))


# --- what a checkpoint records, and the refusal -----------------------------------------------------------
def resume_errors(world_size: int, order: SampleOrder, cfg: TrainConfig, data_fingerprint: str | None,
                  problem: LinearProblem) -> list[str]:
    """The error each rank's resume raised (every rank must raise one)."""
    world = ThreadWorld(world_size)
    trainers = [FakeTrainer(world, rank, problem, cfg, order=order, data_fingerprint=data_fingerprint)
                for rank in range(world_size)]

    def fit_and_catch(trainer: FakeTrainer) -> str:
        try:
            trainer.fit()
        except CheckpointError as exc:
            return str(exc)
        return "resumed"

    return world.run([lambda t=t: fit_and_catch(t) for t in trainers])


def first_run(checkpoint_dir: str, order: SampleOrder, **fields: object) -> LinearProblem:
    problem = LinearProblem.make(order.num_samples)
    fit(2, order, config(epochs=2, batch_size=4, checkpoint_dir=checkpoint_dir, max_steps=5, **fields),
        problem)
    return problem


@pytest.mark.parametrize(("change", "named"), [
    ({"lanes": 8}, "lanes 4 -> 8"),
    ({"window": 3}, "window 96 -> 3"),  # the default: twice the mean shard size
    ({"seed": 1}, "seed 0 -> 1"),
])
def test_a_resume_across_a_change_of_the_order_is_refused_on_every_rank_naming_it(
        checkpoint_dir: str, change: dict[str, int], named: str) -> None:
    shards = DATASETS["uneven"]
    problem = first_run(checkpoint_dir, ShardOrder(shards, lanes=4))
    order = ShardOrder(shards, lanes=change.get("lanes", 4), window=change.get("window"))
    cfg = config(epochs=2, batch_size=4, checkpoint_dir=checkpoint_dir, resume="auto",
                 seed=change.get("seed", 0))

    errors = resume_errors(3, order, cfg, "index-1", problem)

    assert len(set(errors)) == 1 and "\n" not in errors[0]
    assert "sample order changed" in errors[0] and named in errors[0], errors[0]
    assert "start a new run" in errors[0]


def test_a_resume_across_a_change_of_the_shard_sizes_is_refused(checkpoint_dir: str) -> None:
    problem = first_run(checkpoint_dir, ShardOrder((10, 20, 30), lanes=2))

    errors = resume_errors(2, ShardOrder((20, 10, 30), lanes=2), config(
        epochs=2, batch_size=4, checkpoint_dir=checkpoint_dir, resume="auto"), "index-1", problem)

    assert set(errors) == {errors[0]} and "sample order changed (shard sizes;" in errors[0], errors[0]


def test_a_resume_across_a_change_of_the_data_s_index_is_refused_on_every_rank(checkpoint_dir: str) -> None:
    order = ShardOrder(DATASETS["uneven"], lanes=4)
    problem = first_run(checkpoint_dir, order)

    errors = resume_errors(2, order, config(epochs=2, batch_size=4, checkpoint_dir=checkpoint_dir,
                                            resume="auto"), "index-2", problem)

    assert len(set(errors)) == 1
    assert "the training data's index changed (index-1 -> index-2" in errors[0], errors[0]
    assert "sample order" not in errors[0]


def test_in_memory_data_records_its_order_and_a_changed_seed_is_refused(checkpoint_dir: str) -> None:
    from hvdazure.core.sample_plan import UniformOrder
    order = UniformOrder(40)
    problem = first_run(checkpoint_dir, order)

    errors = resume_errors(2, order, config(epochs=2, batch_size=4, checkpoint_dir=checkpoint_dir,
                                            resume="auto", seed=7), "index-1", problem)

    assert "seed 0 -> 7" in errors[0], errors[0]


def test_a_checkpoint_from_before_the_order_was_recorded_resumes_as_before(
        checkpoint_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    order = ShardOrder(DATASETS["uneven"], lanes=4)
    with monkeypatch.context() as patched:  # the manifest of an earlier hvdazure: no order, no data
        patched.setattr(core_trainer, "data_order_record", lambda plan, data: {})
        problem = first_run(checkpoint_dir, order)

    errors = resume_errors(2, ShardOrder(DATASETS["uneven"], lanes=8), config(
        epochs=2, batch_size=4, checkpoint_dir=checkpoint_dir, resume="auto"), "index-2", problem)

    assert errors == ["resumed", "resumed"]


def test_the_manifest_records_the_order_and_the_data_fingerprint(checkpoint_dir: str) -> None:
    from hvdazure.core.checkpoint.store import CheckpointManager
    order = ShardOrder((10, 20, 30), lanes=2, window=5)
    first_run(checkpoint_dir, order)

    manifest = CheckpointManager(checkpoint_dir).checkpoints()[-1].manifest

    assert manifest["order_fingerprint"] == order.fingerprint(seed=0)
    assert manifest["order"] == {"seed": 0, "num_samples": 60, "lanes": 2, "window": 5, "shards": 3}
    assert manifest["data_fingerprint"] == "index-1"
