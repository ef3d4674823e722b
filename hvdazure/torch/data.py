"""DataLoaders over the user's map-style Dataset that follow core/sharding.py's plan, epoch by epoch."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from hvdazure.core.sharding import ShardPlan, eval_range


class ShardedBatchSampler(Sampler[list[int]]):
    """This rank's non-empty micro-batches for one epoch, from sample position `start_sample` on. A new one
    is made every epoch, so the order changes with the epoch without anyone calling set_epoch(). (An empty
    micro-batch of a short last step has nothing to load: the trainer skips it, see ShardPlan.)"""

    def __init__(self, plan: ShardPlan, epoch: int, start_sample: int = 0) -> None:
        self.plan, self.epoch, self.start_sample = plan, epoch, start_sample

    def __iter__(self) -> Iterator[list[int]]:
        for step in self.plan.epoch(self.epoch, self.start_sample):
            for micro_batch in step:
                if not micro_batch.is_empty:
                    yield micro_batch.indices

    def __len__(self) -> int:
        return sum(not mb.is_empty for step in self.plan.epoch(self.epoch, self.start_sample) for mb in step)


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
