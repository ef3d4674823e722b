"""The user's data as the PyTorch binding reads it: one view per kind of data (`data_view`: MapStyleData for a
map-style Dataset, ShardedData for a ShardedDataset), and DataLoaders over the core's walk of the plan."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, TensorDataset, default_collate

from hvdazure.core.backend import DataError
from hvdazure.core.sample_plan import MicroBatch, SampleOrder, SamplePlan, UniformOrder, eval_range
from hvdazure.core.step_batches import EpochSteps, StepCursor, loaded_cells
from hvdazure.data.dataset import ShardedDataset, read_ahead_steps

# Where a refused dataset is pointed (the TensorFlow binding says the same of a tf.data stream)
SHARDED_INSTEAD = ("return a map-style Dataset (with __len__ and __getitem__), or write the data into shards "
                   "(`hvdazure data pack FOLDER OUT`, or hvdazure.data.write_shards from Python) and return "
                   "hvdazure.data.ShardedDataset(source)")


def random_access(dataset: Any, what: str) -> Any:
    """`dataset` if each rank can read its exact share of it (a map-style Dataset); else a DataError in one
    line saying what to return instead. An IterableDataset is a stream: it cannot give the same samples
    per step at any world size, each once per epoch."""
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        raise DataError(f"{what} returned a {type(dataset).__name__}, a stream without random access (no "
                        "len() or indexing): hvdazure gives each rank its exact share of a dataset it can "
                        f"index (each sample once per epoch at any world size); {SHARDED_INSTEAD}")
    return dataset


class MapStyleData:
    """A map-style Dataset as the binding reads it: the uniform permutation, nothing fetched ahead, and
    micro-batches loaded by a DataLoader (a TensorDataset with the default collate a batch at a time: one
    indexing per tensor, the same batch as stacking its samples, ~10x faster than a sample at a time)."""

    data_fingerprint: str | None = None  # nothing to check on resume: the data is the user's code

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def order(self) -> SampleOrder:
        return UniformOrder(len(self))

    def reading_ahead(self, steps: StepCursor) -> Iterator[list[MicroBatch]]:
        """`steps` as they are: there is nothing to fetch ahead."""
        return steps

    def read_ahead(self, samples: Iterable[int]) -> None:
        """Nothing to fetch ahead (an evaluation's range)."""

    def loader(self, batches: Iterable[list[int]], collate_fn: Callable | None, num_workers: int,
               pin_memory: bool = False) -> DataLoader:
        """A DataLoader of the samples at each of `batches`' lists of indices; `collate_fn` None: torch's
        default_collate."""
        dataset = self.dataset
        if collate_fn is None and type(dataset) is TensorDataset:
            dataset, collate_fn = _TensorBatches(dataset.tensors), _as_is
        return DataLoader(dataset, batch_sampler=batches, collate_fn=collate_fn or default_collate,
                          num_workers=num_workers, pin_memory=pin_memory)


class ShardedData:
    """A ShardedDataset as the binding reads it: its own order (few shards per rank), the coming steps'
    shards fetched ahead, and micro-batches read whole: with a batch_decode, its batches are used as they
    are; with the default decode and collate, by columns (`ShardedDataset.read_columns`: arrays decoded
    straight into the batch), the same batch, bit for bit, as default_collate of its samples."""

    def __init__(self, dataset: ShardedDataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def order(self) -> SampleOrder:
        return self.dataset.sample_order

    @property
    def data_fingerprint(self) -> str | None:
        return self.dataset.data_fingerprint

    def reading_ahead(self, steps: StepCursor) -> Iterator[list[MicroBatch]]:
        """`steps`, handing the dataset the coming steps' samples as each one starts (read_ahead_steps)."""
        return read_ahead_steps(self.dataset, steps)

    def read_ahead(self, samples: Iterable[int]) -> None:
        """Fetch the shards of `samples` (an evaluation's range: its first shards, fetched now)."""
        self.dataset.read_ahead(samples)

    def loader(self, batches: Iterable[list[int]], collate_fn: Callable | None, num_workers: int,
               pin_memory: bool = False) -> DataLoader:
        """A DataLoader of the samples at each of `batches`' lists of indices; `collate_fn` None: torch's
        default_collate (by columns for the default decode)."""
        dataset: Dataset | ShardedDataset = self.dataset
        if self.dataset.batch_decode is not None:
            collate_fn = _as_is
        elif self.dataset.decode is None and collate_fn is None:
            dataset, collate_fn = _ShardedColumns(self.dataset), collate_columns
        return DataLoader(dataset, batch_sampler=batches, collate_fn=collate_fn or default_collate,
                          num_workers=num_workers, pin_memory=pin_memory)


DataView = MapStyleData | ShardedData


@functools.singledispatch
def data_view(data: Any, what: str) -> DataView:
    """The binding's view of train_dataset()/eval_dataset()'s data, chosen here once by its type: a
    ShardedData for a ShardedDataset, a MapStyleData for a map-style Dataset (a stream refused, see
    random_access)."""
    return MapStyleData(random_access(data, what))


@data_view.register(ShardedDataset)
def _sharded_view(data: ShardedDataset, what: str) -> DataView:
    return ShardedData(data)


class ShardedBatchSampler(Sampler[list[int]]):
    """The indices of the micro-batches with samples of `steps` (a cursor over the core's walk of this
    rank's plan, see core/step_batches.py), read as the DataLoader asks: it iterates this sampler in the
    main process, ahead of its workers, so `view.reading_ahead` hands a ShardedDataset the coming steps'
    samples as each step starts. One pass: a new one is made for every stream of batches. (An empty
    micro-batch of a short last step has nothing to load: the trainer skips it, see SamplePlan.)"""

    def __init__(self, steps: StepCursor, view: DataView) -> None:
        self.steps, self.view = steps, view
        self._len = steps.num_batches

    def __iter__(self) -> Iterator[list[int]]:
        return (micro_batch.indices for micro_batch in loaded_cells(self.view.reading_ahead(self.steps)))

    def __len__(self) -> int:
        return self._len


def epoch_loader(view: DataView, steps: StepCursor, collate_fn: Callable | None, num_workers: int,
                 pin_memory: bool) -> DataLoader:
    """Batches of the micro-batches with samples of `steps`, in order."""
    return view.loader(ShardedBatchSampler(steps, view), collate_fn, num_workers, pin_memory)


def train_loader(dataset: Dataset | ShardedDataset, plan: SamplePlan, epoch: int, start_sample: int,
                 collate_fn: Callable | None, num_workers: int, pin_memory: bool) -> DataLoader:
    """Batches for this rank's micro-batches of `epoch` from `start_sample` on, in plan order, outside a
    trainer (benchmarks, tests): over a walk of the plan of its own."""
    steps = EpochSteps(plan, epoch, start_sample).cursor()
    return epoch_loader(data_view(dataset, "the dataset"), steps, collate_fn, num_workers, pin_memory)


def make_loader(dataset: Dataset | ShardedDataset, batches: Iterable[list[int]], collate_fn: Callable | None,
                num_workers: int, pin_memory: bool = False) -> DataLoader:
    """A DataLoader of the samples at each of `batches`' lists of indices, as the data's view loads them."""
    return data_view(dataset, "the dataset").loader(batches, collate_fn, num_workers, pin_memory)


class _ShardedColumns(Dataset):
    """A ShardedDataset with its default decode, read a micro-batch at a time by columns (`__getitems__`,
    which the DataLoader calls with each batch of the sampler)."""

    def __init__(self, dataset: ShardedDataset) -> None:
        self.dataset = dataset

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> Any:
        columns = self.dataset.read_columns(indices)
        return _Columns(columns) if columns is not None else self.dataset.__getitems__(indices)

    def __len__(self) -> int:
        return len(self.dataset)


class _Columns(dict):
    """A micro-batch by columns (ShardedDataset.read_columns), told apart from a list of samples."""


def collate_columns(batch: Any) -> Any:
    """default_collate's batch: of a micro-batch by columns, a stacked array's tensor (shared, not copied)
    and default_collate of each other field's values (what default_collate does field by field); of a
    list of samples, default_collate. Module-level: DataLoader workers pickle it."""
    if not isinstance(batch, _Columns):
        return default_collate(batch)
    return {name: torch.from_numpy(values) if isinstance(values, np.ndarray) else default_collate(values)
            for name, values in batch.items()}


class _TensorBatches(Dataset):
    """A TensorDataset's tensors, read a batch of indices at a time (`__getitems__`, which the DataLoader
    uses when a dataset has it): the list of batched tensors that default_collate makes of the samples."""

    def __init__(self, tensors: tuple[torch.Tensor, ...]) -> None:
        self.tensors = tensors

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return tuple(tensor[index] for tensor in self.tensors)

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.int64)
        return [tensor[index] for tensor in self.tensors]

    def __len__(self) -> int:
        return len(self.tensors[0])


def _as_is(batch: Any) -> Any:
    """The collate of a batch that is already one (module-level: DataLoader workers pickle it)."""
    return batch


def eval_batches(num_samples: int, batch_size: int, world_size: int, rank: int) -> list[list[int]]:
    """This rank's evaluation batches: a contiguous slice of the set, unpadded (possibly none)."""
    indices = list(eval_range(num_samples, world_size, rank))
    return [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]


def empty_batch(view: DataView, collate_fn: Callable | None) -> Any:
    """A batch of no samples in the structure of the data's batches: sample 0's batch, cut to no rows (for
    a rank that must run a forward pass without samples, see sync_batchnorm.py)."""
    return _no_rows(next(iter(view.loader([[0]], collate_fn, 0))))


def _no_rows(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[:0]
    if isinstance(batch, dict):
        return {k: _no_rows(v) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        rows = [_no_rows(v) for v in batch]
        return type(batch)(*rows) if hasattr(batch, "_fields") else type(batch)(rows)
    return batch


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor in a (nested) batch to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, list | tuple):
        moved = [to_device(v, device) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch
