"""One walk of the plan per epoch (core/step_batches.py): the loop's cursor and the loader's read the same
walk; each binding's loader and a sharded dataset's read-ahead take their steps from it, never from a walk
of their own; and the bindings choose their view of the data once, without isinstance checks."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hvdazure.core.sample_plan import SamplePlan
from hvdazure.core.step_batches import EpochSteps, StepBatches, loaded_cells

ROOT = Path(__file__).resolve().parents[3]


class CountedPlan(SamplePlan):
    """A plan that records every walk of an epoch: (epoch, start_sample)."""

    def epoch(self, epoch: int, start_sample: int = 0) -> Any:
        WALKS.append((epoch, start_sample))
        return super().epoch(epoch, start_sample)


WALKS: list[tuple[int, int]] = []


@pytest.fixture(autouse=True)
def _no_walks_yet() -> None:
    WALKS.clear()


def _cells(plan: SamplePlan, epoch: int, start: int = 0) -> list[list[int]]:
    return [mb.indices for step in SamplePlan.epoch(plan, epoch, start) for mb in step if not mb.is_empty]


@pytest.mark.parametrize(("samples", "batch", "world", "accum"),
                         [(37, 4, 2, 2), (10, 3, 4, 1), (50, 5, 3, 3), (7, 2, 8, 1), (64, 4, 4, 4)])
def test_micro_batches_left_is_the_walks_count_of_micro_batches_with_samples(samples, batch, world, accum):
    for rank, start in itertools.product(range(world), range(0, samples + 1, 3)):
        plan = SamplePlan(samples, batch, world, rank, accum, seed=1)
        assert plan.micro_batches_left(start) == len(_cells(plan, 0, start)), (rank, start)


def test_the_loop_and_the_loader_read_one_walk_of_the_plan_and_the_buffer_stays_short() -> None:
    plan = CountedPlan(100, batch_size=2, world_size=2, rank=1, grad_accum_steps=2, seed=5)
    walk = EpochSteps(plan, 3, 10)
    loop, loader = walk.cursor(), walk.cursor()
    loaded = iter(loaded_cells(loader))

    expected = list(SamplePlan.epoch(plan, 3, 10))
    given, buffered = [], []
    for step in loop:
        given.append(step)
        with_samples = [mb for mb in step if not mb.is_empty]
        assert [next(loaded) for _ in with_samples] == with_samples
        if with_samples:  # a step with nothing to load (a short last step's) does not move the loader
            assert loader.coming(2) == expected[len(given):len(given) + 2]  # look-ahead, the same walk
        buffered.append(len(walk._steps))

    assert given == expected and WALKS == [(3, 10)]
    assert max(buffered) <= 4  # the step trained, and the two looked ahead at, not the epoch
    assert loader.num_batches == len(_cells(plan, 3, 10))


def test_a_cursor_opened_during_a_step_starts_at_that_step() -> None:
    plan = SamplePlan(20, batch_size=2, world_size=1, rank=0)
    walk = EpochSteps(plan, 0, 0)
    loop = walk.cursor()
    first, second = next(loop), next(loop)

    late = walk.cursor()
    assert next(late) == second and late.num_batches == plan.micro_batches_left(first[0].step_samples)


def test_step_batches_continue_the_open_walk_where_the_loop_left_it_else_walk_again() -> None:
    plan = CountedPlan(24, batch_size=4, world_size=1, rank=0, seed=2)
    opened: list[int] = []

    def open_epoch(steps: Any) -> Any:
        opened.append(len(opened))
        return (mb.indices for mb in loaded_cells(steps))

    batches = StepBatches(plan, open_epoch)
    trained: list[list[int]] = []
    for step in batches.epoch(0, 0):
        trained += [list(batch) for batch in batches.of_step(step)]
        if len(trained) == 2:
            break  # max_steps: fit() again goes on from here
    for step in batches.epoch(0, 8):
        trained += [list(batch) for batch in batches.of_step(step)]
    for step in batches.epoch(0, 4):  # a resume at another point: a new walk and stream
        trained += [list(batch) for batch in batches.of_step(step)]

    cells = _cells(plan, 0)
    assert trained == cells + cells[1:]
    assert WALKS == [(0, 0), (0, 4)] and opened == [0, 1]


def test_an_empty_micro_batch_gets_no_batch_and_opens_no_stream() -> None:
    batches = StepBatches(SamplePlan(2, batch_size=2, world_size=2, rank=1), lambda steps: iter(()))
    (step,) = batches.epoch(0, 0)  # 2 samples, both in a cell of rank 0: rank 1's is empty

    assert list(batches.of_step(step)) == [None]


def test_the_bindings_have_no_isinstance_check_of_a_sharded_dataset() -> None:
    command = ["grep", "-rn", "isinstance(.*ShardedDataset", "hvdazure/torch", "hvdazure/tensorflow"]
    found = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 1 and found.stdout == "", found.stdout


def _read_ahead_of(data: Any) -> list[list[int]]:
    asked: list[list[int]] = []
    data.read_ahead = lambda samples: asked.append(list(map(int, samples)))
    return asked


class TestTorch:
    torch = pytest.importorskip("torch")

    def test_the_sharded_loader_reads_ahead_from_the_loops_walk_without_walking_the_plan(self, shards):
        from hvdazure.data import ShardedDataset
        from hvdazure.torch.data import ShardedData, data_view, epoch_loader

        data = ShardedDataset(str(shards))
        view = data_view(data, "train_dataset()")
        assert type(view) is ShardedData and view.data_fingerprint == data.data_fingerprint
        asked = _read_ahead_of(data)
        plan = CountedPlan(len(data), batch_size=3, world_size=2, rank=0, seed=1, order=view.order)
        batches = StepBatches(plan, lambda steps: iter(epoch_loader(view, steps, None, 0, False)))

        got = [batch for step in batches.epoch(1, 5) for batch in batches.of_step(step)]

        cells = _cells(plan, 1, 5)
        assert WALKS == [(1, 5)] and len(got) == len(cells)
        for batch, cell in zip(got, cells, strict=True):
            assert self.torch.equal(batch["y"], self.torch.as_tensor(np.stack([data[i]["y"] for i in cell])))
        steps = [[mb.indices for mb in step] for step in SamplePlan.epoch(plan, 1, 5)]
        assert asked[0] == [i for step in steps[:5] for cell in step for i in cell]  # this step and 4 ahead

    def test_a_map_style_dataset_gets_the_uniform_view(self) -> None:
        from torch.utils.data import TensorDataset

        from hvdazure.core.sample_plan import UniformOrder
        from hvdazure.torch.data import MapStyleData, data_view

        view = data_view(TensorDataset(self.torch.zeros(6, 1)), "train_dataset()")
        assert type(view) is MapStyleData and view.order == UniformOrder(6) and view.data_fingerprint is None


class TestTensorFlow:
    tf = pytest.importorskip("tensorflow")

    def test_the_sharded_batches_read_ahead_from_the_loops_walk_without_walking_the_plan(self, shards):
        from hvdazure.data import ShardedDataset
        from hvdazure.tensorflow.data import ShardedData, data_view

        data = ShardedDataset(str(shards))
        view = data_view(data, "train_dataset()")
        assert type(view) is ShardedData and view.data_fingerprint == data.data_fingerprint
        asked = _read_ahead_of(data)
        plan = CountedPlan(len(data), batch_size=4, world_size=1, rank=0, seed=3, order=view.order)
        batches = StepBatches(plan, lambda steps: view.batches(loaded_cells(view.reading_ahead(steps))))

        got = [batch for step in batches.epoch(0, 0) for batch in batches.of_step(step)]

        cells = _cells(plan, 0)
        assert WALKS == [(0, 0)] and len(got) == len(cells)
        for batch, cell in zip(got, cells, strict=True):
            np.testing.assert_array_equal(batch["y"], np.stack([data[i]["y"] for i in cell]))
        assert len(asked) == len(cells)

    def test_arrays_get_the_uniform_view(self) -> None:
        from hvdazure.core.sample_plan import UniformOrder
        from hvdazure.tensorflow.data import ArrayData, data_view

        view = data_view(np.zeros((6, 2)), "train_dataset()")
        assert type(view) is ArrayData and view.order == UniformOrder(6) and view.data_fingerprint is None
        assert data_view(view, "again") is view
