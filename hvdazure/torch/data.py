"""DataLoaders over the user's map-style Dataset that follow core/sharding.py's plan, epoch by epoch."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from hvdazure.core.sharding import ShardPlan, eval_range

STAND_IN = [0]  # the sample a rank with an empty micro-batch runs with loss weight 0 (see ShardPlan)


class ShardedBatchSampler(Sampler[list[int]]):
    """This rank's micro-batches for one epoch, from sample position `start_sample` on. A new one is made
    every epoch, so the order changes with the epoch without anyone calling set_epoch()."""

    def __init__(self, plan: ShardPlan, epoch: int, start_sample: int = 0) -> None:
        self.plan, self.epoch, self.start_sample = plan, epoch, start_sample

    def __iter__(self) -> Iterator[list[int]]:
        for step in self.plan.epoch(self.epoch, self.start_sample):
            for micro_batch in step:
                yield micro_batch.indices or STAND_IN

    def __len__(self) -> int:
        return self.plan.steps_left(self.start_sample) * self.plan.grad_accum_steps


def train_loader(dataset: Dataset, plan: ShardPlan, epoch: int, start_sample: int, collate_fn: Callable,
                 num_workers: int, pin_memory: bool) -> DataLoader:
    """Batches for this rank's micro-batches of `epoch`, in plan order."""
    return DataLoader(dataset, batch_sampler=ShardedBatchSampler(plan, epoch, start_sample),
                      collate_fn=collate_fn, num_workers=num_workers, pin_memory=pin_memory)


def eval_batches(num_samples: int, batch_size: int, world_size: int, rank: int) -> list[list[int]]:
    """This rank's evaluation batches: a contiguous slice of the set, unpadded (possibly none)."""
    indices = list(eval_range(num_samples, world_size, rank))
    return [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]


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
