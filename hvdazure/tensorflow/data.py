"""The user's training and evaluation data as random-access arrays, batched along core/sample_plan.py's plan.

Accepted: a NumPy array or tensor, a tuple/list/dict of them (the same first dimension), or a finite
`tf.data.Dataset` of such elements, which is read once into memory. Random access is what makes the core's
policy exact (the same sample set per step at any world size, each sample once per epoch); a streaming
pipeline of unknown length cannot offer it, so it is refused with the ways round in the message (data
bigger than memory: hvdazure.data.ShardedDataset).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from hvdazure.core.backend import DataError
from hvdazure.core.sample_plan import MicroBatch, SampleOrder, UniformOrder
from hvdazure.core.step_batches import StepCursor
from hvdazure.data.dataset import ShardedDataset, read_ahead_steps

# Training batches larger than this are prefetched in a tf.data pipeline; smaller ones are gathered directly.
PREFETCH_ABOVE_BYTES = 1 << 20


class ArrayData:
    """A nested structure of arrays sharing their first dimension (the sample index)."""

    def __init__(self, data: Any, what: str) -> None:
        if isinstance(data, tf.data.Dataset):
            data = _read_dataset(data, what)
        self.structure = tf.nest.map_structure(_as_array, data)
        lengths = {len(a) for a in tf.nest.flatten(self.structure)}
        if len(lengths) != 1:
            raise ValueError(f"{what}: the arrays have different numbers of samples {sorted(lengths)}")
        self.num_samples = lengths.pop()

    def __len__(self) -> int:
        return self.num_samples

    data_fingerprint: str | None = None  # data in memory: nothing to check on resume

    @property
    def order(self) -> SampleOrder:
        return UniformOrder(self.num_samples)

    def reading_ahead(self, steps: StepCursor) -> Iterator[list[MicroBatch]]:
        """`steps` as they are: the arrays are in memory."""
        return steps

    def read_ahead(self, samples: np.ndarray) -> None:
        """Nothing to fetch: the arrays are in memory."""

    def take(self, indices: Sequence[int]) -> Any:
        """The samples at `indices`, in that order, as one batch (NumPy arrays in the data's structure)."""
        index = np.asarray(indices, dtype=np.int64)
        return tf.nest.map_structure(lambda a: a[index], self.structure)

    def signature(self) -> Any:
        """TensorSpecs of a batch of any size: a compiled step is traced once for all batch sizes."""
        return tf.nest.map_structure(lambda a: tf.TensorSpec((None, *a.shape[1:]), tf.as_dtype(a.dtype)),
                                     self.structure)

    def batches(self, micro_batches: Iterable[MicroBatch]) -> Iterator[Any]:
        """The non-empty micro-batches' samples, in order. Small batches are gathered when asked for (NumPy:
        ~0.1 ms for 1 MB), cheaper than the ~0.4 ms of CPU a tf.data pipeline spends per element; larger ones
        come from a prefetching pipeline, so that gathering them overlaps the current step."""
        cells = [mb.indices for mb in micro_batches if not mb.is_empty]
        largest = max(map(len, cells), default=0)
        if largest * self.bytes_per_sample <= PREFETCH_ABOVE_BYTES:
            return (self.take(indices) for indices in cells)
        return iter(tf.data.Dataset.from_generator(lambda: (self.take(indices) for indices in cells),
                                                   output_signature=self.signature()).prefetch(2))

    @property
    def bytes_per_sample(self) -> int:
        """The size of one sample, all arrays together."""
        return sum(a[:1].nbytes for a in tf.nest.flatten(self.structure))


class ShardedData:
    """A ShardedDataset as the TensorFlow binding reads it: batches of this rank's micro-batches through a
    prefetching tf.data pipeline (from_generator, `.prefetch`), never the whole set in memory. A batch is
    the decoded samples stacked (NumPy), or what the dataset's batch_decode returns (e.g. the dict of
    tensors of tf.io.parse_example)."""

    def __init__(self, dataset: ShardedDataset) -> None:
        self.dataset = dataset
        self._signature: Any = None

    def __len__(self) -> int:
        return len(self.dataset)

    @property
    def order(self) -> SampleOrder:
        return self.dataset.sample_order

    @property
    def data_fingerprint(self) -> str | None:
        return self.dataset.data_fingerprint

    def read_ahead(self, samples: np.ndarray) -> None:
        """Fetch the shards of `samples` (an evaluation's range: its first shards, fetched now)."""
        self.dataset.read_ahead(samples)

    def take(self, indices: Sequence[int]) -> Any:
        """The samples at `indices`, in that order, as one batch (no indices: an empty batch of the
        signature's shapes)."""
        if not len(indices):
            return tf.nest.map_structure(
                lambda spec: np.zeros((0, *[d or 0 for d in spec.shape[1:]]), spec.dtype.as_numpy_dtype),
                self.signature())
        columns = self.dataset.read_columns(list(indices))  # the default decode: by columns, stacked
        if columns is not None:
            return {name: values if isinstance(values, np.ndarray) else np.stack(values)
                    for name, values in columns.items()}
        samples = self.dataset.__getitems__(list(indices))
        if self.dataset.batch_decode is not None:
            return samples
        return tf.nest.map_structure(lambda *xs: np.stack(xs), *samples)

    def signature(self) -> Any:
        """TensorSpecs of a batch of any size, from a batch of the first two samples (read once)."""
        if self._signature is None:
            first = self.take(range(min(2, len(self))))
            self._signature = tf.nest.map_structure(
                lambda a: tf.TensorSpec((None, *a.shape[1:]), tf.as_dtype(a.dtype)), first)
        return self._signature

    def reading_ahead(self, steps: StepCursor) -> Iterator[list[MicroBatch]]:
        """`steps`, handing the dataset the coming steps' samples as each one starts (read_ahead_steps)."""
        return read_ahead_steps(self.dataset, steps)

    def batches(self, micro_batches: Iterable[MicroBatch]) -> Iterator[Any]:
        """The non-empty micro-batches' samples, in order, read and decoded in a tf.data thread two
        batches ahead of the step."""
        cells = (mb.indices for mb in micro_batches if not mb.is_empty)
        return iter(tf.data.Dataset.from_generator(lambda: (self.take(indices) for indices in cells),
                                                   output_signature=self.signature()).prefetch(2))


DataView = ArrayData | ShardedData


@functools.singledispatch
def data_view(data: Any, what: str) -> DataView:
    """The binding's view of train_dataset()/eval_dataset()'s data, chosen here once by its type: ShardedData
    for a ShardedDataset, an ArrayData as it is (a subclass may make its samples as they are taken),
    ArrayData (in memory) for anything else."""
    return ArrayData(data, what)


@data_view.register(ArrayData)
def _as_given(data: ArrayData, what: str) -> DataView:
    return data


@data_view.register(ShardedDataset)
def _sharded_view(data: ShardedDataset, what: str) -> DataView:
    return ShardedData(data)


def output_as_numpy(value: Any) -> np.ndarray:
    """A prediction (tensor or array) as NumPy; bfloat16, which a .npz holds only pickled, as float32."""
    array = np.asarray(value.numpy() if isinstance(value, tf.Tensor | tf.Variable) else value)
    return array.astype(np.float32) if array.dtype.name == "bfloat16" else array


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, tf.Tensor | tf.Variable):
        return value.numpy()
    return np.asarray(value)


def _read_dataset(dataset: tf.data.Dataset, what: str) -> Any:
    cardinality = int(dataset.cardinality())
    if cardinality < 0:
        kind = "infinite" if cardinality == tf.data.INFINITE_CARDINALITY else "of unknown length"
        raise DataError(
            f"{what} is a tf.data.Dataset {kind}: hvdazure needs random access to give each rank its exact "
            "share (each sample once per epoch at any world size). For data that fits in memory, return "
            "arrays or a finite, unbatched dataset (e.g. dataset.apply(tf.data.experimental."
            "assert_cardinality(n))), which is read into memory once; for data that does not, write it "
            "into shards (`hvdazure data pack FOLDER OUT`, or hvdazure.data.write_shards; TFRecord files "
            "are shards already: `hvdazure data index DIR`) and return hvdazure.data.ShardedDataset(source)")
    elements = list(dataset.as_numpy_iterator())
    if not elements:
        raise ValueError(f"{what} is an empty tf.data.Dataset")
    return tf.nest.map_structure(lambda *xs: np.stack(xs), *elements)
