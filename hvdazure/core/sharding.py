"""Which samples each rank uses at each step: exactly once per epoch, independent of the world size.

Policy. Every epoch has its own permutation of the dataset, drawn from (seed, epoch) alone. Optimizer step t
uses the samples at positions [t*G, (t+1)*G) of that permutation, G being the global batch (batch_size x
world_size x grad_accum_steps), so the set of samples of step t does not depend on how many ranks share it:
N ranks with batch b see, step by step, what 1 process with batch N*b sees. Within a step, micro-batch k of
rank r is the next `batch_size` positions in (k, r) order.

The remainder is neither dropped nor padded: the last step holds the N mod G samples left, split as evenly
as possible over micro-batches and ranks, so every sample is used exactly once per epoch and none twice.
A (rank, micro-batch) cell can be left empty; such a rank still runs the step on a stand-in sample whose
loss weight is 0, so every rank runs the same number of steps and collectives (no hang), and each cell's
`weight` (its share of the step's samples) makes the averaged gradient the exact mean over the step.

Evaluation is split into contiguous, nearly equal ranges per rank with no padding; metrics are summed with
their sample counts and divided once, so the result equals the single-process one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """The order of the whole dataset in `epoch`: a function of (seed, epoch) only."""
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


@dataclass(frozen=True)
class MicroBatch:
    """The samples one rank uses in one micro-batch, and their share of the optimizer step's samples."""

    indices: list[int]
    step_samples: int  # samples in the whole optimizer step, all ranks and micro-batches together

    @property
    def is_empty(self) -> bool:
        return not self.indices

    @property
    def weight(self) -> float:
        """Factor for this micro-batch's mean loss so that averaging over ranks gives the step's mean."""
        return len(self.indices) / self.step_samples


@dataclass(frozen=True)
class ShardPlan:
    """The sample plan of one rank for training epochs."""

    num_samples: int
    batch_size: int
    world_size: int
    rank: int
    grad_accum_steps: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("batch_size", "world_size", "grad_accum_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.num_samples < 1:
            raise ValueError(f"the training dataset is empty (num_samples={self.num_samples})")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in 0..{self.world_size - 1}")

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
        order = epoch_permutation(self.num_samples, self.seed, epoch)
        return self._micro_batches(order, step * self.global_batch_size)

    def epoch(self, epoch: int, start_sample: int = 0) -> Iterator[list[MicroBatch]]:
        """This rank's micro-batches, step by step, from position `start_sample` of the epoch's order to its
        end. A resumed run passes the samples already consumed, which need not be a multiple of the global
        batch when the world size changed: each remaining sample is still used exactly once."""
        if not 0 <= start_sample <= self.num_samples:
            raise ValueError(f"start_sample {start_sample} is not in 0..{self.num_samples}")
        order = epoch_permutation(self.num_samples, self.seed, epoch)
        for start in range(start_sample, self.num_samples, self.global_batch_size):
            yield self._micro_batches(order, start)

    def steps_left(self, start_sample: int) -> int:
        """Optimizer steps from position `start_sample` to the end of the epoch."""
        return -(-(self.num_samples - start_sample) // self.global_batch_size)

    def _micro_batches(self, order: np.ndarray, start: int) -> list[MicroBatch]:
        chunk = order[start : start + self.global_batch_size]
        cells = self.world_size * self.grad_accum_steps
        batches = []
        for k in range(self.grad_accum_steps):
            begin, end = _piece(len(chunk), cells, k * self.world_size + self.rank)
            batches.append(MicroBatch(chunk[begin:end].tolist(), len(chunk)))
        return batches


def _piece(total: int, parts: int, index: int) -> tuple[int, int]:
    """Bounds of piece `index` when `total` is cut into `parts` consecutive pieces whose sizes differ by at
    most one, larger first: a total that divides evenly is split exactly evenly."""
    base, extra = divmod(total, parts)
    begin = index * base + min(index, extra)
    return begin, begin + base + (1 if index < extra else 0)


def eval_range(num_samples: int, world_size: int, rank: int) -> range:
    """This rank's contiguous slice of the evaluation set (sizes differ by at most one; none padded)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    return range(*_piece(num_samples, world_size, rank))
