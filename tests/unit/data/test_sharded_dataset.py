"""hvdazure.data.ShardedDataset on local tar shards: samples by global number, batches, the order and
fingerprint the trainers use, read-ahead into the shard cache, open readers, and copies in other processes."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from distributed.sharded_data import NUM_SAMPLES, SHARD_SIZES, regression, write_regression_shards

from hvdazure.core.sample_plan import SamplePlan
from hvdazure.core.step_batches import EpochSteps
from hvdazure.data import ShardedDataset, load_index
from hvdazure.data import dataset as dataset_module
from hvdazure.data.dataset import read_ahead_steps
from hvdazure.data.shard_order import ShardOrder


class RecordingShards:
    """A test double of the cache (hvdazure.data.cache.Shards): the shards in place, and every read-ahead
    queue it was handed; `cached` are the shards it reports as already on this node."""

    def __init__(self, base: Path, cached: Sequence[str] = ()) -> None:
        self.base, self.cached = base, set(cached)
        self.queues: list[list[str]] = []
        self.closed = False

    def local_path(self, entry: object) -> str:
        return str(self.base / entry.path)  # type: ignore[attr-defined]

    def prefetch(self, entries: Sequence[object]) -> None:
        self.queues.append([e.path for e in entries])  # type: ignore[attr-defined]

    def is_cached(self, entry: object) -> bool:
        return entry.path in self.cached  # type: ignore[attr-defined]

    def close(self) -> None:
        self.closed = True


def with_shards(data: ShardedDataset, shards: RecordingShards) -> ShardedDataset:
    data._shards_here()  # this process's state, then the double in place of the cache
    data._shards = shards  # type: ignore[assignment]
    return data


def test_samples_are_numbered_shard_by_shard_in_index_order(shards: Path) -> None:
    data = ShardedDataset(str(shards))
    x, y = regression(NUM_SAMPLES)

    assert len(data) == NUM_SAMPLES
    for i in (0, 7, 8, 10, 31, 32, 36):
        sample = data[i]
        assert sample["index"] == i
        np.testing.assert_array_equal(sample["x"], x[i])
        np.testing.assert_array_equal(sample["y"], y[i])


def test_a_batch_holds_the_samples_in_the_order_asked_and_batch_decode_gets_them_raw(shards: Path) -> None:
    asked = [36, 0, 9, 8, 20, 1]
    plain = ShardedDataset(str(shards), lambda raw: int(raw["index.cls"]))
    batched = ShardedDataset(str(shards), batch_decode=lambda raws: [int(r["index.cls"]) for r in raws])

    assert plain.__getitems__(asked) == asked
    assert batched.__getitems__(asked) == asked


def test_the_order_and_fingerprint_are_the_index_s(shards: Path) -> None:
    data = ShardedDataset(str(shards), lanes=3, window=5)

    assert data.sample_order == ShardOrder(SHARD_SIZES, lanes=3, window=5)
    assert data.data_fingerprint == load_index(str(shards)).fingerprint()


def test_read_ahead_queues_the_upcoming_shards_in_order_of_first_use_not_yet_cached(shards: Path) -> None:
    names = [entry.path for entry in load_index(str(shards)).shards]
    recording = RecordingShards(shards, cached=[names[1]])
    data = with_shards(ShardedDataset(str(shards), prefetch_shards=2), recording)

    data.read_ahead(np.array([12, 13, 36, 0, 1, 9, 20]))  # shards 1, 1, 4, 0, 0, 1, 2

    assert recording.queues == [[names[4], names[0]]]  # at most prefetch_shards


def test_read_ahead_steps_hands_over_the_coming_steps_samples_as_each_step_starts(shards: Path) -> None:
    recording = RecordingShards(shards)
    data = with_shards(ShardedDataset(str(shards), prefetch_shards=10), recording)
    seen: list[list[int]] = []
    data.read_ahead = lambda samples: seen.append(list(samples))  # type: ignore[method-assign]
    plan = SamplePlan(10, batch_size=2, world_size=1, rank=0, seed=4)
    steps = list(plan.epoch(0))
    samples = [step[0].indices for step in steps]

    assert list(read_ahead_steps(data, EpochSteps(plan, 0, 0).cursor(), ahead=1)) == steps
    assert seen == [samples[i] + (samples[i + 1] if i + 1 < len(samples) else []) for i in range(5)]


def test_at_most_open_readers_shards_stay_open_the_least_recently_used_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dataset_module, "OPEN_READERS", 3)
    data = ShardedDataset(str(write_regression_shards(tmp_path / "twelve", samples_per_shard=2,
                                                      num_samples=12)))

    data.__getitems__([0, 2, 4, 6, 0, 10])  # shards 0, 1, 2, 3, 0, 5 (read in shard order)

    assert list(data._readers) == [2, 3, 5]
    assert data[1]["index"] == 1 and list(data._readers) == [3, 5, 0]


def test_a_copy_in_another_process_reads_through_its_own_readers_and_cache(shards: Path) -> None:
    data = ShardedDataset(str(shards))
    parents = data._shards_here()
    data[3]

    copy = pickle.loads(pickle.dumps(data))  # a DataLoader worker started by spawn
    assert copy._shards is None and not copy._readers
    assert copy[3]["index"] == 3

    data._pid = -1  # as a forked worker sees its parent's state: dropped, not closed, and opened anew
    assert data[4]["index"] == 4
    assert data._shards is not parents and list(data._readers) == [0]


def test_the_plan_of_a_sharded_dataset_follows_its_order(shards: Path) -> None:
    data = ShardedDataset(str(shards), lanes=2)
    plans = [SamplePlan(len(data), 4, 2, rank, order=data.sample_order) for rank in range(2)]

    used = sorted(i for plan in plans for step in plan.epoch(0) for mb in step for i in mb.indices)

    assert used == list(range(NUM_SAMPLES))
