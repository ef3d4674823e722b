"""The batched read path gives what the per-sample path gives: the same samples, in the same order, bit
for bit, in every format, across uneven shards and batches spanning shards; and it keeps every check
(tar header checksums, TFRecord CRCs, cut shards)."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest

from hvdazure.core.sample_plan import SamplePlan
from hvdazure.data import ShardedDataset, write_shards
from hvdazure.data.formats import open_shard

FORMATS = ["tar", "tfrecord", "parquet"]
NUM_SAMPLES = 23  # shards of 5, 5, 5, 5, 3


def samples(n: int = NUM_SAMPLES) -> list[dict]:
    rng = np.random.default_rng(3)
    return [{"image": rng.integers(0, 256, (4, 3), dtype=np.uint8), "vector": rng.normal(size=5),
             "grid": rng.normal(size=(2, 2, 2)).astype(np.float32),
             "flags": rng.integers(0, 2, 3).astype(bool),
             "label": int(rng.integers(0, 10)), "score": float(rng.normal()), "text": f"sample {i}"}
            for i in range(n)]


@pytest.fixture(scope="module", params=FORMATS)
def dataset(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ShardedDataset:
    folder = tmp_path_factory.mktemp(request.param) / "d"
    write_shards(samples(), str(folder), request.param, samples_per_shard=5, progress=False)
    return ShardedDataset(str(folder), cache=False)


# batches: contiguous in one shard, spanning two shards, the last (short) shard, every shard, reversed,
# a sample twice, one sample
BATCHES = [[0, 1, 2], [3, 4, 5, 6], [20, 21, 22], list(range(NUM_SAMPLES)), [22, 9, 0, 14, 5],
           [7, 7, 8, 2], [11]]


def assert_same_values(got: object, want: object, where: str) -> None:
    assert type(got) is type(want), where
    if isinstance(want, np.ndarray | np.generic):
        assert got.dtype == want.dtype and np.shape(got) == np.shape(want), where  # type: ignore[union-attr]
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), where
    else:
        assert got == want, where


def stacked_samples(data: ShardedDataset, indices: list[int]) -> dict:
    """The per-sample path: each sample read alone, then np.stack (what the TF binding did) per field."""
    one_by_one = [data[i] for i in indices]
    return {name: [sample[name] for sample in one_by_one] for name in one_by_one[0]}


@pytest.mark.parametrize("indices", BATCHES, ids=lambda b: ",".join(map(str, b)))
def test_read_columns_is_the_samples_read_one_by_one(dataset: ShardedDataset, indices: list[int]) -> None:
    columns = dataset.read_columns(indices)
    want = stacked_samples(dataset, indices)

    assert columns is not None and list(columns) == list(want)
    for name, values in want.items():
        got = columns[name]
        if isinstance(got, np.ndarray):
            assert_same_values(got, np.stack(values), name)
        else:
            assert len(got) == len(values)
            for k, (g, w) in enumerate(zip(got, values, strict=True)):
                assert_same_values(g, w, f"{name}[{k}]")


@pytest.mark.parametrize("indices", BATCHES, ids=lambda b: ",".join(map(str, b)))
def test_getitems_is_the_samples_read_one_by_one(dataset: ShardedDataset, indices: list[int]) -> None:
    batch = dataset.__getitems__(indices)

    assert len(batch) == len(indices)
    for got, i in zip(batch, indices, strict=True):
        want = dataset[i]
        assert list(got) == list(want)
        for name in want:
            assert_same_values(got[name], want[name], f"sample {i} {name}")


def test_read_many_is_read_at_each_position(dataset: ShardedDataset) -> None:
    rng = np.random.default_rng(0)
    for entry in dataset.index.shards:
        reader = open_shard(f"{dataset.index.base}/{entry.path}", entry)
        try:
            for _ in range(10):
                positions = sorted(rng.integers(0, entry.num_samples, rng.integers(1, 8)).tolist())
                got, want = reader.read_many(positions), [reader.read(p) for p in positions]
                assert len(got) == len(want), positions
                for g, w in zip(got, want, strict=True):
                    if isinstance(w, dict):  # parquet's raw rows hold arrays
                        assert list(g) == list(w)
                        for name in w:
                            assert_same_values(g[name], w[name], f"{positions} {name}")
                    else:
                        assert g == w, positions
        finally:
            reader.close()


def test_the_torch_loader_reads_batches_by_columns_bit_for_bit(dataset: ShardedDataset,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, default_collate

    from hvdazure.torch.data import train_loader

    plan = SamplePlan(len(dataset), 4, 2, 1, seed=5, order=dataset.sample_order)
    cells = [mb.indices for step in plan.epoch(1) for mb in step if not mb.is_empty]
    asked: list[list[int]] = []
    original = ShardedDataset.read_columns
    monkeypatch.setattr(ShardedDataset, "read_columns",
                        lambda self, indices: asked.append(list(indices)) or original(self, indices))

    batched = list(train_loader(dataset, plan, 1, 0, None, 0, pin_memory=False))
    per_sample = list(DataLoader(_OneByOne(dataset), batch_sampler=cells, collate_fn=default_collate))

    assert asked == cells  # every batch came through read_columns, in plan order
    assert len(batched) == len(per_sample) == len(cells)
    for got, want in zip(batched, per_sample, strict=True):
        assert list(got) == list(want)
        for name in want:
            if isinstance(want[name], torch.Tensor):
                assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape, name
                assert torch.equal(got[name], want[name]), name
            else:
                assert got[name] == want[name], name


class _OneByOne:
    """A dataset read one sample at a time (no __getitems__): the per-sample path."""

    def __init__(self, dataset: ShardedDataset) -> None:
        self.dataset = dataset

    def __getitem__(self, i: int) -> dict:
        return self.dataset[i]

    def __len__(self) -> int:
        return len(self.dataset)


def test_the_tensorflow_binding_reads_batches_by_columns(dataset: ShardedDataset) -> None:
    pytest.importorskip("tensorflow")
    from hvdazure.tensorflow.data import ShardedData

    view = ShardedData(dataset)
    for indices in BATCHES:
        batch = view.take(indices)
        want = stacked_samples(dataset, indices)
        assert sorted(batch) == sorted(want)
        for name, values in want.items():
            assert_same_values(batch[name], np.stack(values), name)


def test_a_user_decode_sees_the_raw_samples_of_the_per_sample_path(tmp_path: Path) -> None:
    write_shards(samples(), str(tmp_path / "d"), "tar", samples_per_shard=5, progress=False)
    seen: list[dict] = []
    data = ShardedDataset(str(tmp_path / "d"), decode=lambda raw: seen.append(raw) or raw["label.cls"],
                          cache=False)

    got = data.__getitems__([6, 5, 4, 12])

    assert got == [data[i] for i in (6, 5, 4, 12)]
    assert all(isinstance(value, bytes | str) for raw in seen for value in raw.values())
    assert data.read_columns([0, 1]) is None  # a dataset with its own decode has no columns path


# --- the checks stay ------------------------------------------------------------------------------------
def written(tmp_path: Path, fmt: str) -> tuple[ShardedDataset, Path]:
    write_shards(samples(12), str(tmp_path / "d"), fmt, samples_per_shard=12, progress=False)
    return ShardedDataset(str(tmp_path / "d"), cache=False), tmp_path / "d" / f"shard-00000.{fmt}"


def damage(path: Path, at: int) -> None:
    """Flip a bit at byte `at`, keeping the file's size and mtime (what the index checks before a read)."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize("member", [0, 1])
def test_a_bad_tar_header_checksum_in_a_batch_is_the_per_sample_error(tmp_path: Path, member: int) -> None:
    data, path = written(tmp_path, "tar")
    entry = data.index.shards[0]
    header = int(entry.offsets[5])
    if member:  # a later member's header: walk one header and its data on
        size = int(path.read_bytes()[header + 124:header + 136].split(b"\0")[0].strip() or b"0", 8)
        header += 512 + -(-size // 512) * 512
    damage(path, header + 3)  # a byte of the name: only the checksum tells
    data = ShardedDataset(str(tmp_path / "d"), cache=False)

    with pytest.raises(ValueError) as alone:
        data[5]
    for read in (lambda: data.__getitems__([4, 5, 6]), lambda: data.read_columns([0, 5, 11])):
        with pytest.raises(ValueError) as batched:
            read()
        assert str(batched.value) == str(alone.value)
    assert "sample 5" in str(alone.value) and "checksum" in str(alone.value)


def test_a_bad_tfrecord_crc_in_a_run_names_the_record(tmp_path: Path) -> None:
    data, path = written(tmp_path, "tfrecord")
    entry = data.index.shards[0]
    damage(path, int(entry.offsets[7]) + 20)  # inside record 7's data

    for read in (lambda: data.__getitems__([6, 7, 8]), lambda: data.read_columns(list(range(12)))):
        with pytest.raises(ValueError, match=r"shard-00000\.tfrecord: record 7 \(byte \d+\): bad CRC of the "
                                             "data"):
            read()
    assert data.read_columns([5, 6, 8, 9, 10, 11]) is not None  # the other records read


def test_the_last_tfrecord_record_read_in_a_run(tmp_path: Path) -> None:
    data, _ = written(tmp_path, "tfrecord")

    got = data.__getitems__([9, 10, 11])

    assert [s["text"] for s in got] == [b"sample 9", b"sample 10", b"sample 11"]


def test_every_batch_of_an_epoch_is_the_same_through_both_paths(dataset: ShardedDataset) -> None:
    for world, rank in itertools.product((1, 3), (0,)):
        plan = SamplePlan(len(dataset), 3, world, rank, seed=1, order=dataset.sample_order)
        for step in plan.epoch(0):
            for mb in step:
                if mb.is_empty:
                    continue
                columns = dataset.read_columns(mb.indices)
                assert columns is not None
                assert columns["text"] == [dataset[i]["text"] for i in mb.indices]
                assert_same_values(columns["image"], np.stack([dataset[i]["image"] for i in mb.indices]),
                                   "image")


def test_a_batch_over_more_shards_than_readers_kept_reads_them_all(
        dataset: ShardedDataset, monkeypatch: pytest.MonkeyPatch) -> None:
    from hvdazure.data import dataset as dataset_module

    monkeypatch.setattr(dataset_module, "OPEN_READERS", 2)
    dataset.close()  # no reader open: the batch opens five
    indices = [0, 5, 10, 15, 20, 1]  # five shards

    got = dataset.read_columns(indices)

    assert got is not None and got["text"] == [dataset[i]["text"] for i in indices]
    assert len(dataset._readers) == 2


def test_loader_workers_read_by_columns_the_same_batches(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from hvdazure.torch.data import train_loader

    write_shards(samples(), str(tmp_path / "d"), "tar", samples_per_shard=5, progress=False)
    data = ShardedDataset(str(tmp_path / "d"), cache=False)
    plan = SamplePlan(len(data), 4, 1, 0, seed=2, order=data.sample_order)

    in_workers = list(train_loader(data, plan, 0, 0, None, 2, pin_memory=False))
    in_process = list(train_loader(data, plan, 0, 0, None, 0, pin_memory=False))

    assert len(in_workers) == len(in_process) > 1
    for got, want in zip(in_workers, in_process, strict=True):
        assert got["text"] == want["text"]
        assert all(torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype
                   for k in ("image", "vector", "grid", "flags", "label", "score"))
