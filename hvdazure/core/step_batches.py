"""One walk of the plan per epoch, and the cursors that read it: the loop's, and the loader's ahead of it.

The core walks this rank's plan (`SamplePlan.epoch`) once per epoch, from a sample position on, into a
buffer (`EpochSteps`). Every reader of the epoch's steps is a cursor over that one walk: the training
loop's, step by step, and the backend's (`StepCursor`, handed to `Backend.epoch_batches`), from which its
loader takes the micro-batches to load ahead of the loop (a DataLoader's sampler, a prefetching tf.data
pipeline), and a sharded dataset the coming steps' samples to fetch (`coming`). Nobody walks the plan again,
so what the loader loads is what the loop trains on by construction, not by keeping two walks in step. A
step stays buffered while some cursor still holds it, and steps are walked only as far as the cursor
furthest ahead has asked.

`StepBatches` gives each optimizer step its batches from the backend's stream: the stream is opened over a
new cursor by the step's first batch (inside the backend's step), and steps then take their batches from
it in turn. A new walk, and so a new stream, starts whenever training is not where the previous step
left it: a new epoch, or a resume point.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from hvdazure.core.sample_plan import MicroBatch, SamplePlan
from hvdazure.core.step_times import StepTimes


class EpochSteps:
    """This rank's steps of `epoch` from sample position `start_sample` on, walked once, as far as its
    cursors have asked, and kept while a cursor holds them."""

    def __init__(self, plan: SamplePlan, epoch: int, start_sample: int) -> None:
        self.plan, self.epoch, self.start_sample = plan, epoch, start_sample
        self._walk = plan.epoch(epoch, start_sample)
        self._steps: deque[list[MicroBatch]] = deque()  # walked and still held, from step `_first` on
        self._first, self._first_sample = 0, start_sample  # the first buffered step and its position
        self._cursors: list[StepCursor] = []

    def cursor(self) -> StepCursor:
        """A new cursor, at the first step still held (the first of the walk until some cursor moves on
        from it: the loop's holds the step it trains until it asks for the next)."""
        cursor = StepCursor(self, self._first, self._first_sample)
        self._cursors.append(cursor)
        return cursor

    def _step(self, index: int) -> list[MicroBatch] | None:
        """Step `index` of the walk (counted from its start), walked into the buffer if need be; None past
        the end of the epoch."""
        while self._first + len(self._steps) <= index:
            step = next(self._walk, None)
            if step is None:
                return None
            self._steps.append(step)
        return self._steps[index - self._first]

    def _release(self) -> None:
        """Drop the steps no cursor holds any more."""
        held = min(cursor.holds for cursor in self._cursors)
        while self._first < held and self._steps:
            self._first_sample += self._steps.popleft()[0].step_samples
            self._first += 1


class StepCursor:
    """One reader of an epoch's walk: its steps in order (`next`), the ones after them (`coming`), and how
    many micro-batches with samples it has from its start to the epoch's end (arithmetic on the plan)."""

    def __init__(self, steps: EpochSteps, first: int, start_sample: int) -> None:
        self._steps, self._next, self._start = steps, first, first
        self.samples = start_sample  # the sample position after the steps this cursor has given
        self.num_batches = steps.plan.micro_batches_left(start_sample)

    @property
    def holds(self) -> int:
        """The first step this cursor may still need: the one it gave last (being trained or loaded)."""
        return max(self._start, self._next - 1)

    def __iter__(self) -> StepCursor:
        return self

    def __next__(self) -> list[MicroBatch]:
        step = self._steps._step(self._next)
        if step is None:
            raise StopIteration
        self._next += 1
        self.samples += step[0].step_samples
        self._steps._release()
        return step

    def coming(self, count: int) -> list[list[MicroBatch]]:
        """Up to `count` steps after the ones given so far, without moving on (what to fetch ahead)."""
        coming = []
        for index in range(self._next, self._next + count):
            step = self._steps._step(index)
            if step is None:
                break
            coming.append(step)
        return coming


def loaded_cells(steps: Iterator[list[MicroBatch]]) -> Iterator[MicroBatch]:
    """The micro-batches with samples of `steps`, in order: the ones a backend loads (an empty micro-batch
    has nothing to load, see SamplePlan)."""
    return (micro_batch for step in steps for micro_batch in step if not micro_batch.is_empty)


class StepBatches:
    """The loop's steps of each epoch, and each step's batches: those of the backend's stream that
    `open_epoch(cursor)` opens over a cursor of the same walk."""

    def __init__(self, plan: SamplePlan, open_epoch: Callable[[StepCursor], Iterator[Any]],
                 times: StepTimes | None = None) -> None:
        self._plan, self._open_epoch = plan, open_epoch
        self._times = times if times is not None else StepTimes(enabled=False)  # the data wait's clock
        self._walk: EpochSteps | None = None
        self._loop: StepCursor | None = None
        self._batches: Iterator[Any] | None = None

    def epoch(self, epoch: int, start_sample: int) -> Iterator[list[MicroBatch]]:
        """The loop's cursor over `epoch` from `start_sample`: the open walk's where training is where its
        last step left it (fit() again after max_steps), else a new walk's."""
        if self._loop is None or self._walk is None or (self._walk.epoch, self._loop.samples) != (
                epoch, start_sample):
            self._walk = EpochSteps(self._plan, epoch, start_sample)
            self._loop, self._batches = self._walk.cursor(), None
        return self._loop

    def of_step(self, micro_batches: list[MicroBatch]) -> Iterator[Any]:
        """The batches of the step the loop's cursor gave last (None for an empty micro-batch), read as
        iterated: the stream is opened by the first one, inside the backend's step. The wait for each is
        the step's data wait (core/step_times.py)."""
        for micro_batch in micro_batches:
            if micro_batch.is_empty:
                yield None
                continue
            since = self._times.now()
            if self._batches is None:
                assert self._walk is not None, "of_step before epoch()"
                self._batches = self._open_epoch(self._walk.cursor())
            batch = next(self._batches)
            self._times.add("data", since)
            yield batch
