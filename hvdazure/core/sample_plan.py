"""Which samples each rank uses at each step: exactly once per epoch, independent of the world size.

Policy. Every epoch has its own permutation of the dataset, drawn from (seed, epoch) alone. Optimizer step t
uses the samples at positions [t*G, (t+1)*G) of that permutation, G being the global batch (batch_size x
world_size x grad_accum_steps), so the set of samples of step t does not depend on how many ranks share it:
N ranks with batch b see, step by step, what 1 process with batch N*b sees. Within a step, micro-batch k of
rank r is the next `batch_size` positions in (k, r) order.

The remainder is neither dropped nor padded: the last step holds the N mod G samples left, split as evenly
as possible over micro-batches and ranks, so every sample is used exactly once per epoch and none twice.
A cell gets at least 2 samples whenever the step holds enough to allow it within `batch_size` (layers such
as BatchNorm cannot train on one sample), so a short last step may use fewer cells. A (rank, micro-batch)
cell can be left empty: that rank runs no forward pass for it (with synchronized BatchNorm, one on no
samples, whose statistics' allreduces need every rank) but still takes part in the step's gradient
allreduce (with zeros), so every rank runs the same number of steps and collectives (no hang),
and each cell's `loss_weight` (its share of the step's samples) makes the averaged gradient the exact mean
over the step.

Which samples of a step go to which cell is the order's choice (the `SampleOrder` a plan is given). The
default, `UniformOrder`, is the permutation above with cells in (micro-batch, rank) order: random access is
cheap for data in memory or on local disk. Sharded data on object storage uses the order of its dataset
instead (hvdazure/data/shard_order.py), which groups a step's samples by where they are stored so that each
rank reads few shards;
the cell sizes and loss weights are the same for every order, and the gradient is a sum over the step,
so the assignment inside a step changes nothing but float rounding.

Evaluation is split into contiguous, nearly equal ranges per rank with no padding; metrics are summed with
their sample counts and divided once, so the result equals the single-process one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the whole dataset in `epoch`: a function of (seed, epoch) only."""
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


def fingerprint(description: dict[str, Any]) -> str:
    """A short, stable hash of what an order depends on, for a checkpoint to record and compare."""
    text = json.dumps(description, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class SampleOrder(Protocol):
    """The order of the samples in an epoch, and how a step's samples are arranged for reading."""

    @property
    def num_samples(self) -> int: ...

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        """Every sample once, as global sample indices: a function of (seed, epoch) and the order's own
        parameters, never of the world size."""
        ...

    def group_for_reading(self, samples: np.ndarray, seed: int) -> np.ndarray | None:
        """A step's samples rearranged so that samples read together are adjacent (each rank then takes
        one stretch of it); None keeps the cells at consecutive positions in (micro-batch, rank) order."""
        ...

    def fingerprint(self, seed: int) -> str:
        """A hash of everything the order depends on: a resume across a change of it must be refused."""
        ...

    def describe(self) -> dict[str, Any]:
        """The order's own parameters, JSON-ready, beside the seed and sample count a checkpoint records
        (a refused resume names those that changed); {} for an order with none."""
        ...


@dataclass(frozen=True)
class UniformOrder:
    """One uniform permutation per epoch (`epoch_permutation`): for data in memory or random-access."""

    num_samples: int

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        return epoch_permutation(self.num_samples, seed, epoch)

    def group_for_reading(self, samples: np.ndarray, seed: int) -> np.ndarray | None:
        return None

    def fingerprint(self, seed: int) -> str:
        return fingerprint({"order": "uniform/1", "num_samples": self.num_samples, "seed": seed})

    def describe(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class MicroBatch:
    """The samples one rank uses in one micro-batch, and their share of the optimizer step's samples."""

    indices: list[int]
    step_samples: int  # samples in the whole optimizer step, all ranks and micro-batches together

    @property
    def is_empty(self) -> bool:
        return not self.indices

    def loss_weight(self, ranks_averaged: int) -> float:
        """Factor for this micro-batch's mean loss so that the gradient allreduce gives the step's mean.

        `ranks_averaged` is what the allreduce divides by (the world size for an average, 1 for a sum).
        One division of integers, so a full step without accumulation gets exactly 1.0 at any world size
        (`len / step_samples * world_size` is not 1.0 for some sizes, e.g. 49)."""
        return len(self.indices) * ranks_averaged / self.step_samples


@dataclass(frozen=True)
class SamplePlan:
    """The sample plan of one rank for training epochs."""

    num_samples: int
    batch_size: int
    world_size: int
    rank: int
    grad_accum_steps: int = 1
    seed: int = 0
    order: SampleOrder | None = field(default=None, repr=False)  # None: UniformOrder(num_samples)

    def __post_init__(self) -> None:
        for name in ("batch_size", "world_size", "grad_accum_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.num_samples < 1:
            raise ValueError(f"the training dataset is empty (num_samples={self.num_samples})")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in 0..{self.world_size - 1}")
        if self.order is not None and self.order.num_samples != self.num_samples:
            raise ValueError(f"the sample order covers {self.order.num_samples} samples but the dataset "
                             f"has num_samples={self.num_samples}")

    @property
    def sample_order(self) -> SampleOrder:
        """The order this plan follows: the one it was given, else the uniform permutation."""
        return self.order if self.order is not None else UniformOrder(self.num_samples)

    def order_fingerprint(self) -> str:
        """What a checkpoint records to refuse a resume across a change of the order (or its seed); the
        world size and batch size are not in it, since a resume may change them."""
        return self.sample_order.fingerprint(self.seed)

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size * self.grad_accum_steps

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch; the last one may be partial (never dropped)."""
        return -(-self.num_samples // self.global_batch_size)

    def step(self, epoch: int, step: int) -> list[MicroBatch]:
        """This rank's micro-batches for optimizer step `step` of `epoch` (a run that never changed size)."""
        if not 0 <= step < self.steps_per_epoch:
            raise ValueError(f"step {step} is not in 0..{self.steps_per_epoch - 1}")
        order = self.sample_order.epoch_order(self.seed, epoch)
        return self._micro_batches(order, step * self.global_batch_size)

    def epoch(self, epoch: int, start_sample: int = 0) -> Iterator[list[MicroBatch]]:
        """This rank's micro-batches, step by step, from position `start_sample` of the epoch's order to its
        end. A resumed run passes the samples already consumed, which need not be a multiple of the global
        batch when the world size changed: each remaining sample is still used exactly once."""
        if not 0 <= start_sample <= self.num_samples:
            raise ValueError(f"start_sample {start_sample} is not in 0..{self.num_samples}")
        order = self.sample_order.epoch_order(self.seed, epoch)
        for start in range(start_sample, self.num_samples, self.global_batch_size):
            yield self._micro_batches(order, start)

    def steps_left(self, start_sample: int) -> int:
        """Optimizer steps from position `start_sample` to the end of the epoch."""
        return -(-(self.num_samples - start_sample) // self.global_batch_size)

    def micro_batches_left(self, start_sample: int) -> int:
        """This rank's micro-batches with samples from position `start_sample` to the end of the epoch,
        without walking it: every cell of a full step has samples, and a short last step fills its first
        `_cells_used` cells in (micro-batch, rank) order (whatever the order does within the step)."""
        full, last = divmod(self.num_samples - start_sample, self.global_batch_size)
        used = self._cells_used(last) if last else 0
        return full * self.grad_accum_steps + sum(
            1 for k in range(self.grad_accum_steps) if k * self.world_size + self.rank < used)

    def smallest_micro_batch(self, start_sample: int = 0, across_ranks: bool = False) -> int:
        """The fewest samples any non-empty micro-batch of any rank gets, from `start_sample` to the end of
        the epoch (only the last step can be short). `across_ranks`: of micro-batch k, all ranks' samples
        together (what a synchronized BatchNorm normalises over), for every k that has samples somewhere."""
        last = (self.num_samples - start_sample) % self.global_batch_size or self.global_batch_size
        full = last == self.global_batch_size
        if not across_ranks:
            return self.batch_size if full else last // self._cells_used(last)
        if full:
            return self.batch_size * self.world_size
        used, ranks = self._cells_used(last), self.world_size
        sizes = [sum(_size(last, used, k * ranks + r) for r in range(ranks))
                 for k in range(self.grad_accum_steps)]
        return min(size for size in sizes if size)

    def nearest_batch_sizes(self, min_micro_batch: int, count: int = 2,
                            across_ranks: bool = False) -> list[int]:
        """Up to `count` batch sizes nearest this one whose epochs give no micro-batch fewer than
        `min_micro_batch` samples (`across_ranks`: see smallest_micro_batch), for an error message's
        suggestion; ascending."""
        candidates = sorted(range(min_micro_batch, 2 * self.batch_size + min_micro_batch + 1),
                            key=lambda b: (abs(b - self.batch_size), b))
        fits = [b for b in candidates if b != self.batch_size and replace(self, batch_size=b)
                .smallest_micro_batch(across_ranks=across_ranks) >= min_micro_batch]
        return sorted(fits[:count])

    def _cells_used(self, step_samples: int) -> int:
        """How many cells of a step holding `step_samples` get samples: all of them for a full step; for a
        short one as many as give each at least 2 samples, but never more than batch_size per cell."""
        cells = self.world_size * self.grad_accum_steps
        return max(1, -(-step_samples // self.batch_size), min(cells, step_samples // 2))

    def _micro_batches(self, order: np.ndarray, start: int) -> list[MicroBatch]:
        chunk = order[start : start + self.global_batch_size]
        grouped = self.sample_order.group_for_reading(chunk, self.seed)
        if grouped is None:
            return [MicroBatch(chunk[begin:end].tolist(), len(chunk))
                    for begin, end in self._cell_bounds(len(chunk))]
        return [MicroBatch(cell.tolist(), len(chunk)) for cell in self._rank_stretch(grouped)]

    def _cell_bounds(self, step_samples: int) -> list[tuple[int, int]]:
        """This rank's cells as positions in the step, cells laid out in (micro-batch, rank) order."""
        used = self._cells_used(step_samples)
        cells = (k * self.world_size + self.rank for k in range(self.grad_accum_steps))
        return [_piece(step_samples, used, cell) if cell < used else (0, 0) for cell in cells]

    def _rank_stretch(self, grouped: np.ndarray) -> list[np.ndarray]:
        """This rank's cells when the step is grouped for reading: ranks take consecutive stretches of it
        (rank 0 first), so a rank reads what lies together; within its stretch, micro-batches are dealt
        out in turn, so each mixes all of it. The cell sizes are those of `_cell_bounds`."""
        used = self._cells_used(len(grouped))

        def size(rank: int, k: int) -> int:
            cell = k * self.world_size + rank
            begin, end = _piece(len(grouped), used, cell) if cell < used else (0, 0)
            return end - begin

        begin = sum(size(r, k) for r in range(self.rank) for k in range(self.grad_accum_steps))
        sizes = [size(self.rank, k) for k in range(self.grad_accum_steps)]
        mine = grouped[begin : begin + sum(sizes)]
        dealt = sum(1 for n in sizes if n)  # non-empty cells come first and larger first, as k::dealt gives
        return [mine[k::dealt] if k < dealt else mine[:0] for k in range(self.grad_accum_steps)]


def _piece(total: int, parts: int, index: int) -> tuple[int, int]:
    """Bounds of piece `index` when `total` is cut into `parts` consecutive pieces whose sizes differ by at
    most one, larger first: a total that divides evenly is split exactly evenly."""
    base, extra = divmod(total, parts)
    begin = index * base + min(index, extra)
    return begin, begin + base + (1 if index < extra else 0)


def _size(total: int, parts: int, index: int) -> int:
    """The size of cell `index` of a step of `total` samples in `parts` used cells (0 past them)."""
    if index >= parts:
        return 0
    begin, end = _piece(total, parts, index)
    return end - begin


def eval_range(num_samples: int, world_size: int, rank: int) -> range:
    """This rank's contiguous slice of the evaluation set (sizes differ by at most one; none padded)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    return range(*_piece(num_samples, world_size, rank))


def first_eval_batch(num_samples: int, batch_size: int, world_size: int, rank: int) -> range:
    """The evaluation samples a sanity check runs validation_step on (TrainConfig.sanity_check): this rank's
    first batch, or the set's first where this rank has no samples (a set smaller than the world size), so
    that every rank checks the step; empty only for an empty set."""
    mine = eval_range(num_samples, world_size, rank) or range(num_samples)
    return range(mine.start, min(mine.start + batch_size, mine.stop))
