"""TorchTrainer's training and evaluation loaders read a TensorDataset a batch at a time (one indexing per
tensor) instead of a sample at a time: the batches must be exactly those of torch's default DataLoader."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from hvdazure.core.sample_plan import SamplePlan  # noqa: E402
from hvdazure.torch.data import make_loader, train_loader  # noqa: E402


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(37, 3, 2, generator=g), torch.randint(0, 5, (37,), generator=g),
                         torch.arange(37, dtype=torch.float64))


def assert_same_batches(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert type(a) is type(b)
        for x, y in zip(a, b, strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_tensor_dataset_gives_the_batches_of_the_default_collate_in_plan_order(num_workers):
    data, plan = dataset(), SamplePlan(37, batch_size=4, world_size=2, rank=1, grad_accum_steps=2, seed=3)

    got = list(train_loader(data, plan, epoch=1, start_sample=5, collate_fn=None, num_workers=num_workers,
                            pin_memory=False))

    cells = [mb.indices for step in plan.epoch(1, 5) for mb in step if not mb.is_empty]
    expected = list(DataLoader(data, batch_sampler=cells))
    assert_same_batches(got, expected)


def test_evaluation_batches_of_a_tensor_dataset_are_those_of_the_default_collate():
    data, batches = dataset(), [[0, 1, 2], [3], [36, 35]]

    assert_same_batches(list(make_loader(data, batches, None, num_workers=0)),
                        list(DataLoader(data, batch_sampler=batches)))


def test_a_subclass_or_a_collate_of_its_own_is_read_a_sample_at_a_time():
    read = []

    class Logged(TensorDataset):
        def __getitem__(self, index):
            read.append(index)
            return super().__getitem__(index)

    list(make_loader(Logged(*dataset().tensors), [[4, 2]], None, num_workers=0))
    collated = list(make_loader(dataset(), [[4, 2]], lambda samples: len(samples), num_workers=0))

    assert read == [4, 2]
    assert collated == [2]
