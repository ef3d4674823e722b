"""Reading shards fast without giving up a check: readers kept open for the order's shards at hand, tar
members split by hand (long names, pax headers, base-256 sizes), .npy decoded without np.load."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

import hvdazure.data.formats as formats
from hvdazure.core.sample_plan import SamplePlan
from hvdazure.data import ShardedDataset, write_shards
from hvdazure.data.dataset import MIN_OPEN_READERS, readers_kept
from hvdazure.data.formats import scan_shard, tar, tar_header, tfrecord
from hvdazure.data.formats.tf_example import _packed_varints
from hvdazure.data.shard_order import ShardOrder


def test_readers_kept_cover_the_shards_the_order_has_at_hand():
    assert readers_kept(ShardOrder((64,) * 32)) >= 32 * 3
    assert readers_kept(ShardOrder((10,) * 2, lanes=1)) == MIN_OPEN_READERS


def test_an_epoch_opens_each_shard_once_with_more_lanes_than_open_readers(tmp_path, monkeypatch):
    samples = ({"x": np.full(4, i, dtype=np.int32), "label": i} for i in range(32 * 8))
    write_shards(samples, str(tmp_path / "d"), "tar", samples_per_shard=8, progress=False)
    dataset = ShardedDataset(str(tmp_path / "d"), cache=False)
    opened: list[str] = []
    original = formats.open_shard
    monkeypatch.setattr(formats, "open_shard",
                        lambda path, entry: opened.append(path) or original(path, entry))
    plan = SamplePlan(len(dataset), 8, 1, 0, seed=0, order=dataset.sample_order)

    labels = [sample["label"] for step in plan.epoch(0) for cell in step
              for sample in dataset.__getitems__(cell.indices)]
    dataset.close()

    assert sorted(labels) == list(range(32 * 8))
    assert len(opened) == len(set(opened)) == 32


# --- tar members split by hand, as tarfile splits them ------------------------------------------------
def tar_bytes(members: list[tarfile.TarInfo | tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                archive.addfile(member)
                continue
            info = tarfile.TarInfo(member[0])
            info.size = len(member[1])
            archive.addfile(info, io.BytesIO(member[1]))
    return buffer.getvalue()


def read_every_sample(path: Path) -> list[dict]:
    with path.open("rb") as file:
        offsets = scan_shard(file, path.stat().st_size, "tar", name=path.name)
    reader = tar.Reader(str(path), offsets, path.name)
    try:
        return [reader.read(p) for p in range(len(offsets))]
    finally:
        reader.close()


def read_with_tarfile(path: Path) -> list[dict]:
    samples: list[dict] = []
    with tarfile.open(path) as archive:
        for member in archive:
            parts = tar.split_name(member.name) if member.isfile() else None
            if parts is None:
                continue
            if not samples or samples[-1]["__key__"] != parts[0]:
                samples.append({"__key__": parts[0]})
            samples[-1][parts[1]] = archive.extractfile(member).read()
    return samples


LONG = "deep/" + "d" * 150 + "/key"


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT])
def test_long_names_read_as_tarfile_reads_them(tmp_path, fmt):
    name = "p/" + "q" * 120 + "/key" if fmt == tarfile.USTAR_FORMAT else LONG  # ustar: prefix + name
    members = [(f"{name}.bin", b"a" * 700), (f"{name}.cls", b"1"), ("short.bin", b"s"),
               (f"{name}2.txt", "é".encode())]
    path = tmp_path / "shard.tar"
    path.write_bytes(tar_bytes(members, fmt))

    samples = read_every_sample(path)

    assert samples == read_with_tarfile(path)
    assert [s["__key__"] for s in samples] == [name, "short", f"{name}2"]


def test_pax_records_beyond_the_path_are_read_and_ignored(tmp_path):
    info = tarfile.TarInfo("k\u00e9y.bin")  # not ASCII: a pax path record
    info.size = 3
    info.pax_headers = {"comment": "a\nmulti-line = value", "mtime": "1.5"}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        archive.addfile(info, io.BytesIO(b"abc"))
    path = tmp_path / "shard.tar"
    path.write_bytes(buffer.getvalue())

    assert read_every_sample(path) == [{"__key__": "k\u00e9y", "bin": b"abc"}]


def with_header(data: bytes, at: int, field: slice, value: bytes) -> bytes:
    """The tar `data` with one header field replaced and that header's checksum made right again."""
    header = bytearray(data[at:at + 512])
    header[field] = value
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return data[:at] + bytes(header) + data[at + 512:]


def test_a_base_256_size_is_read(tmp_path):
    data = tar_bytes([("a.bin", b"x" * 1000), ("b.bin", b"y")], tarfile.GNU_FORMAT)
    path = tmp_path / "shard.tar"
    path.write_bytes(with_header(data, 0, slice(124, 136), b"\x80" + (1000).to_bytes(11, "big")))

    assert read_every_sample(path) == [{"__key__": "a", "bin": b"x" * 1000}, {"__key__": "b", "bin": b"y"}]
    assert tar_header.number(b"\xff" + b"\xff" * 11) == -1


def test_a_bad_header_checksum_is_one_line_naming_shard_and_sample(tmp_path):
    data = tar_bytes([("a.bin", b"x" * 1000), ("b.bin", b"y")])
    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    with path.open("rb") as file:
        offsets = scan_shard(file, len(data), "tar", name="shard.tar")
    second = int(offsets[1])
    path.write_bytes(data[:second] + b"c" + data[second + 1:])  # the name changed, the checksum not
    reader = tar.Reader(str(path), offsets, "shard.tar")

    with pytest.raises(ValueError, match=r"shard\.tar: sample 1 .*checksum"):
        reader.read(1)
    reader.close()


def test_a_member_cut_after_indexing_is_one_line_naming_shard_and_sample(tmp_path):
    data = tar_bytes([("a.bin", b"x" * 3000), ("b.bin", b"y" * 3000), ("c.bin", b"z")])
    path = tmp_path / "shard.tar"
    path.write_bytes(data)
    with path.open("rb") as file:
        offsets = scan_shard(file, len(data), "tar", name="shard.tar")
    path.write_bytes(data[:int(offsets[1]) + 1000])
    reader = tar.Reader(str(path), offsets, "shard.tar")

    assert reader.read(0) == {"__key__": "a", "bin": b"x" * 3000}
    with pytest.raises(ValueError, match=r"shard\.tar: sample 1 .*truncated"):
        reader.read(1)
    with pytest.raises(ValueError, match=r"shard\.tar: sample 2"):
        reader.read(2)
    reader.close()


def test_links_and_directories_between_members_are_skipped(tmp_path):
    link, directory = tarfile.TarInfo("a.link"), tarfile.TarInfo("a.dir")
    link.type, link.linkname = tarfile.SYMTYPE, "a.bin"
    directory.type = tarfile.DIRTYPE
    path = tmp_path / "shard.tar"
    path.write_bytes(tar_bytes([("a.bin", b"1"), link, directory, ("a.cls", b"2"), ("b.cls", b"3")]))

    assert read_every_sample(path) == read_with_tarfile(path) == [
        {"__key__": "a", "bin": b"1", "cls": b"2"}, {"__key__": "b", "cls": b"3"}]


def test_a_global_pax_header_is_left_to_tarfile(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT,
                      pax_headers={"comment": "global"}) as archive:
        for name, data in [("a.bin", b"1"), ("b.bin", b"2")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    path = tmp_path / "shard.tar"
    path.write_bytes(buffer.getvalue())
    reader = tar.Reader(str(path), np.array([0]), "shard.tar")  # sample 0 starts at the global header

    with pytest.raises(tar_header.Unusual):
        tar._split(path.read_bytes()[:1536])
    assert reader.read(0) == {"__key__": "a", "bin": b"1"}
    reader.close()


# --- .npy without np.load --------------------------------------------------------------------------------
def npy(array: np.ndarray, version: tuple[int, int] | None = None) -> bytes:
    buffer = io.BytesIO()
    if version is None:
        np.save(buffer, array, allow_pickle=False)
    else:
        np.lib.format.write_array(buffer, array, version=version, allow_pickle=False)
    return buffer.getvalue()


@pytest.mark.parametrize("array", [
    np.array(3.5), np.arange(12, dtype=np.int16).reshape(3, 4),
    np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    np.arange(5, dtype=">u4"), np.zeros((0, 3), dtype=np.float32), np.array([(1, 2.0)], dtype="i4,f8"),
    np.array([b"ab", b"c"]), np.array(["x", "yz"]), np.arange(4, dtype=np.complex64)],
    ids=["0-d", "2-d", "fortran", "big-endian", "empty", "structured", "bytes", "str", "complex"])
def test_load_npy_is_what_np_load_gives(array):
    for version in (None, (2, 0)):
        data = npy(array, version)
        got, expected = tar.load_npy(data), np.load(io.BytesIO(data), allow_pickle=False)

        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes(order="A") == expected.tobytes(order="A")
        assert got.flags.f_contiguous == expected.flags.f_contiguous
        assert got.flags.c_contiguous == expected.flags.c_contiguous
        assert got.flags.writeable


def test_load_npy_refuses_object_arrays_as_np_load_does():
    data = _object_npy()
    with pytest.raises(ValueError, match="allow_pickle"):
        tar.load_npy(data)


def _object_npy() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.array([1, "a"], dtype=object), allow_pickle=True)
    return buffer.getvalue()


def test_load_npy_of_cut_data_fails_as_np_load_does():
    data = npy(np.arange(100, dtype=np.int64))[:-8]
    with pytest.raises(ValueError):
        tar.load_npy(data)


def test_the_default_decode_gives_a_0d_npy_as_a_scalar():
    assert tar.decode({"__key__": "k", "x.npy": npy(np.array(7, dtype=np.int8))}) == {"__key__": "k", "x": 7}


# --- TFRecord: short varints in a vectorised path, records in one pread ------------------------------------
@pytest.mark.parametrize("high", [256, 16384, 16385, 2**21])
def test_packed_varints_of_one_or_two_bytes_and_longer_round_trip(high):
    values = np.random.default_rng(high).integers(0, high, 3000)
    values[:3] = [0, 127, 128]

    assert tfrecord.parse_example(tfrecord.encode_example({"v": values}))["v"].tolist() == values.tolist()


def test_a_packed_varint_list_cut_after_a_two_byte_varint_start_is_refused():
    with pytest.raises(ValueError, match="cut inside a varint"):
        _packed_varints(bytes([1, 0x81, 2] * 10) + b"\x81")


@pytest.mark.parametrize("damage", ["cut-middle", "cut-last", "flip-data"])
def test_a_tfrecord_read_in_one_pread_keeps_its_checks(tmp_path, damage):
    records = [tfrecord.frame(tfrecord.encode_example({"i": [i] * 50})) for i in range(3)]
    path = tmp_path / "shard.tfrecord"
    path.write_bytes(b"".join(records))
    with path.open("rb") as file:
        offsets = scan_shard(file, path.stat().st_size, "tfrecord", name="shard.tfrecord")
    data = bytearray(path.read_bytes())
    position = {"cut-middle": 1, "cut-last": 2, "flip-data": 1}[damage]
    if damage == "flip-data":
        data[int(offsets[1]) + 20] ^= 1
    else:
        del data[int(offsets[position]) + 30:]
    path.write_bytes(bytes(data))
    reader = tfrecord.Reader(str(path), offsets, "shard.tfrecord")

    assert tfrecord.parse_example(reader.read(0))["i"].tolist() == [0] * 50
    with pytest.raises(ValueError, match=rf"shard\.tfrecord: record {position} .*(truncated|bad CRC)"):
        reader.read(position)
    reader.close()


# --- Parquet ---------------------------------------------------------------------------------------------
def test_parquet_list_columns_come_back_writeable_and_npy_columns_decoded(tmp_path):
    samples = [{"vector": np.arange(4, dtype=np.uint8) + i, "image": np.full((2, 2), i, dtype=np.int16)}
               for i in range(3)]
    write_shards(iter(samples), str(tmp_path / "d"), "parquet", samples_per_shard=3, progress=False)
    dataset = ShardedDataset(str(tmp_path / "d"), cache=False)

    got = dataset.__getitems__([2, 0])
    dataset.close()

    assert [s["vector"].tolist() for s in got] == [[2, 3, 4, 5], [0, 1, 2, 3]]
    assert all(s["vector"].flags.writeable and s["image"].flags.writeable for s in got)
    assert got[0]["image"].tolist() == [[2, 2], [2, 2]]
