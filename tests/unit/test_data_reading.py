"""Reading shards fast without giving up a check: readers kept open for the order's shards at hand, tar
members split by hand (long names, pax headers, base-256 sizes), .npy decoded without np.load."""

from __future__ import annotations

import numpy as np

import hvdazure.data.formats as formats
from hvdazure.core.shard_order import ShardOrder
from hvdazure.core.sharding import ShardPlan
from hvdazure.data import ShardedDataset, write_shards
from hvdazure.data.dataset import OPEN_READERS, readers_kept


def test_readers_kept_cover_the_shards_the_order_has_at_hand():
    assert readers_kept(ShardOrder((64,) * 32)) >= 32 * 3
    assert readers_kept(ShardOrder((10,) * 2, lanes=1)) == OPEN_READERS


def test_an_epoch_opens_each_shard_once_with_more_lanes_than_open_readers(tmp_path, monkeypatch):
    samples = ({"x": np.full(4, i, dtype=np.int32), "label": i} for i in range(32 * 8))
    write_shards(samples, str(tmp_path / "d"), "tar", samples_per_shard=8, progress=False)
    dataset = ShardedDataset(str(tmp_path / "d"), cache=False)
    opened: list[str] = []
    original = formats.open_shard
    monkeypatch.setattr(formats, "open_shard",
                        lambda path, entry: opened.append(path) or original(path, entry))
    plan = ShardPlan(len(dataset), 8, 1, 0, seed=0, order=dataset.sample_order)

    labels = [sample["label"] for step in plan.epoch(0) for cell in step
              for sample in dataset.__getitems__(cell.indices)]
    dataset.close()

    assert sorted(labels) == list(range(32 * 8))
    assert len(opened) == len(set(opened)) == 32
