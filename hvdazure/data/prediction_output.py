"""Predictions bigger than memory, written as a ShardedDataset: each rank its own part, the index last.

`trainer.predict(dataset, output=URL)` streams each rank's outputs, a batch at a time, into tar shards
named predictions-RANK-NNNNN.tar (ranks predict contiguous runs of the set: core/predictions.py), and rank
0 indexes every rank's shards in rank order once all are written: the index's sample order is the
dataset's, and a directory with an index holds every prediction (without one, the write did not finish).
Sample i is {name: its row} for each output a dict of predict_step names, {"prediction": its row} for a
single array; read it back with `ShardedDataset(URL)`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from hvdazure.data.dataset import ShardedDataset
from hvdazure.data.index import ShardEntry
from hvdazure.data.writers import check_no_shards, write_index, write_shard_files

PREFIX = "predictions"


class PredictionShards:
    """The shards of predictions at `output` (a local directory or an fsspec URL such as abfs://)."""

    def __init__(self, output: str, storage_options: dict[str, Any] | None = None,
                 shard_size: str | int | None = None) -> None:
        self.output, self.storage_options, self.shard_size = output, storage_options, shard_size

    def check_empty(self) -> None:
        """A ValueError if `output` holds shards already (predictions go into a new directory)."""
        check_no_shards(self.output, self.storage_options)

    def write_part(self, rank: int, batches: Iterable[Any]) -> bytes:
        """This rank's batches of outputs (in order) as its shards; what the index will record of them."""
        entries = write_shard_files(_samples(batches), self.output, "tar", self.shard_size,
                                    prefix=f"{PREFIX}-{rank:05d}", storage_options=self.storage_options)
        return json.dumps([entry.as_dict() for entry in entries]).encode()

    def commit(self, parts: list[bytes]) -> None:
        """Index every rank's shards, in rank order (= dataset order): the last write."""
        entries = [ShardEntry(**entry) for part in parts for entry in json.loads(part)]
        write_index(self.output, entries, self.storage_options)

    def open(self) -> ShardedDataset:
        return ShardedDataset(self.output, storage_options=self.storage_options)


def _samples(batches: Iterable[Any]) -> Iterator[dict[str, Any]]:
    for outputs in batches:
        named = outputs if isinstance(outputs, dict) else {"prediction": outputs}
        rows = len(next(iter(named.values())))
        for i in range(rows):
            yield {name: _row(array[i]) for name, array in named.items()}


def _row(value: Any) -> Any:
    """One sample's value as the tar format stores it: arrays as .npy, integer scalars as ints."""
    if isinstance(value, np.integer | np.bool_):
        return int(value)
    return np.asarray(value)
