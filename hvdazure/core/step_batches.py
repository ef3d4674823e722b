"""The step's batch cursor: which batches of the backend's epoch stream the current optimizer step trains on.

A backend opens one stream of batches per epoch (a DataLoader, an array reader), from a sample position
on; steps then take their batches from it in turn. The stream is opened afresh whenever training is not
where the previous step left it: a new epoch, or a resume point.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hvdazure.core.sharding import MicroBatch
from hvdazure.core.state import TrainState


class StepBatches:
    """This rank's batches of each optimizer step, from `open_epoch(epoch, start_sample)`: the batches of
    the non-empty micro-batches of `epoch` from that sample position on, in plan order."""

    def __init__(self, open_epoch: Callable[[int, int], Iterator[Any]]) -> None:
        self._open_epoch = open_epoch
        self._batches: Iterator[Any] | None = None
        self._at: tuple[int, int] | None = None  # (epoch, step_in_epoch) the open stream continues at

    def of_step(self, micro_batches: list[MicroBatch], state: TrainState) -> Iterator[Any]:
        """The batches of the step `state` is at (None for an empty micro-batch), read as iterated: the
        stream is opened (or reopened) by the first one, inside the backend's step."""
        if self._batches is None or self._at != (state.epoch, state.step_in_epoch):
            self._batches = self._open_epoch(state.epoch, state.samples_in_epoch)
        for micro_batch in micro_batches:
            yield None if micro_batch.is_empty else next(self._batches)
        self._at = (state.epoch, state.step_in_epoch + 1)
