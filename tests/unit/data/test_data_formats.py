"""The shard formats: tar (WebDataset), TFRecord (checked against real TensorFlow) and Parquet; every
sample readable at its offset, in any order; corrupt or cut shards give one line naming shard and record."""

from __future__ import annotations

import io
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest

from hvdazure.data.formats import default_decode, format_for, open_shard, scan_shard, tar, tfrecord
from hvdazure.data.formats import parquet as parquet_format
from hvdazure.data.formats.tf_example import _varint_bytes
from hvdazure.data.index import ShardEntry


def entry_for(path: Path, fmt: str) -> ShardEntry:
    with path.open("rb") as file:
        offsets = scan_shard(file, path.stat().st_size, fmt, name=path.name)
    return ShardEntry(path.name, fmt, len(offsets), path.stat().st_size, "v", offsets)


def read_all(path: Path, entry: ShardEntry, order: list[int] | None = None) -> list:
    reader = open_shard(str(path), entry)
    try:
        return [reader.read(p) for p in (order if order is not None else range(entry.num_samples))]
    finally:
        reader.close()


def scan_error(path: Path, fmt: str) -> str:
    with pytest.raises(ValueError) as info, path.open("rb") as file:
        scan_shard(file, path.stat().st_size, fmt, name=str(path))
    return str(info.value)


def assert_one_line_naming(message: str, *names: str) -> None:
    assert "\n" not in message
    for name in names:
        assert name in message


# --- format_for --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("path", "fmt"), [("a/b.tar", "tar"), ("x.tfrecord", "tfrecord"),
                                           ("x.TFRecords", "tfrecord"), ("abfs://c/d/x.parquet", "parquet")])
def test_format_for_knows_the_suffixes(path, fmt):
    assert format_for(path) == fmt


def test_format_for_names_an_unknown_suffix():
    with pytest.raises(ValueError, match=r"data/x\.zip"):
        format_for("data/x.zip")


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="'zip'"):
        default_decode("zip")


# --- tar ---------------------------------------------------------------------------------------------------
def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


LONG_KEY = "deep/" + "d" * 120 + "/sample2"  # past ustar's 100 characters: a pax header first


def webdataset_members() -> list[tuple[str, bytes]]:
    return [("s0.jpg", b"jpeg0"), ("s0.cls", b"3"), ("s0.meta.json", b'{"a": 1}'),
            ("README", b"no extension: skipped"),
            ("s1.jpg", b"x" * 1000), ("s1.cls", b"1"),
            (f"{LONG_KEY}.jpg", b"long"), (f"{LONG_KEY}.txt", "héllo".encode()),
            ("s3.cls", b"7")]


def test_tar_groups_members_by_key_and_reads_every_position_in_any_order(tmp_path):
    path = tmp_path / "shard.tar"
    write_tar(path, webdataset_members())
    entry = entry_for(path, "tar")

    forward = read_all(path, entry)
    backward = read_all(path, entry, order=[3, 2, 1, 0, 2])

    assert entry.num_samples == 4
    assert forward == [
        {"__key__": "s0", "jpg": b"jpeg0", "cls": b"3", "meta.json": b'{"a": 1}'},
        {"__key__": "s1", "jpg": b"x" * 1000, "cls": b"1"},
        {"__key__": LONG_KEY, "jpg": b"long", "txt": "héllo".encode()},
        {"__key__": "s3", "cls": b"7"},
    ]
    assert backward == [forward[3], forward[2], forward[1], forward[0], forward[2]]


def test_tar_offsets_are_the_first_member_headers(tmp_path):
    path = tmp_path / "shard.tar"
    write_tar(path, webdataset_members())
    with tarfile.open(path) as archive:
        first = {}
        for member in archive.getmembers():
            parts = tar.split_name(member.name)
            if parts:
                first.setdefault(parts[0], member.offset)

    assert entry_for(path, "tar").offsets.tolist() == sorted(first.values())


def test_tar_default_decode_turns_types_into_values():
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    buffer = io.BytesIO()
    np.save(buffer, array)
    raw = {"__key__": "k", "jpg": b"\xff\xd8", "cls": b"3", "label.index": b"5", "caption.txt": b"a cat",
           "meta.json": b'{"a": [1, 2]}', "image.npy": buffer.getvalue()}

    decoded = default_decode("tar")(raw)

    assert decoded.pop("image").tolist() == array.tolist()
    assert decoded == {"__key__": "k", "jpg": b"\xff\xd8", "cls": 3, "label": 5, "caption": "a cat",
                       "meta": {"a": [1, 2]}}


def test_tar_encode_round_trips_through_the_default_decode(tmp_path):
    path = tmp_path / "shard.tar"
    samples = [{"image": np.full((2, 2), i, dtype=np.uint8), "label": i, "text": f"t{i}", "jpg": b"j" * i,
                "score": 0.5 * i, "meta": {"i": i}} for i in range(3)]
    with path.open("wb") as file:
        writer = tar.Writer(file)
        for i, sample in enumerate(samples):
            writer.add(*tar.encode(sample, f"{i:06d}"))
        writer.close()
    entry = entry_for(path, "tar")

    decoded = [default_decode("tar")(raw) for raw in read_all(path, entry)]

    for i, (sample, got) in enumerate(zip(samples, decoded, strict=True)):
        assert got.pop("__key__") == f"{i:06d}"
        assert got.pop("image").dtype == np.uint8
        assert got == {k: v for k, v in sample.items() if k != "image"}


def test_tar_empty_shard_has_no_samples_and_one_sample_shard_has_one(tmp_path):
    empty, one = tmp_path / "empty.tar", tmp_path / "one.tar"
    write_tar(empty, [])
    write_tar(one, [("only.bin", b"\x00\x01")])

    assert entry_for(empty, "tar").num_samples == 0
    assert read_all(one, entry_for(one, "tar")) == [{"__key__": "only", "bin": b"\x00\x01"}]


@pytest.mark.parametrize("cut", ["mid-data", "member-boundary", "mid-header"])
def test_a_truncated_tar_is_one_line_naming_the_shard(tmp_path, cut):
    path = tmp_path / "shard.tar"
    write_tar(path, [("a.bin", b"a" * 2000), ("b.bin", b"b" * 2000)])
    data = path.read_bytes()
    with tarfile.open(path) as archive:
        second = archive.getmembers()[1].offset
    keep = {"mid-data": second + 512 + 700, "member-boundary": second, "mid-header": second + 100}[cut]
    path.write_bytes(data[:keep])

    assert_one_line_naming(scan_error(path, "tar"), str(path), "truncated")


def test_a_file_that_is_not_a_tar_is_one_line_naming_it(tmp_path):
    path = tmp_path / "shard.tar"
    path.write_bytes(b"this is not a tar" * 100)

    assert_one_line_naming(scan_error(path, "tar"), str(path))


def test_a_tar_cut_after_indexing_is_one_line_naming_shard_and_sample(tmp_path):
    path = tmp_path / "shard.tar"
    write_tar(path, [("a.bin", b"a" * 2000), ("b.bin", b"b" * 2000)])
    entry = entry_for(path, "tar")
    path.write_bytes(path.read_bytes()[:int(entry.offsets[1]) + 600])

    with pytest.raises(ValueError) as info:
        read_all(path, entry, order=[1])
    assert_one_line_naming(str(info.value), "shard.tar", "sample 1")


# --- TFRecord ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def tf_example(tf, features: dict) -> bytes:
    def feature(value):
        if isinstance(value, tuple) and value[0] == "bytes":
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=value[1]))
        if isinstance(value, tuple) and value[0] == "float":
            return tf.train.Feature(float_list=tf.train.FloatList(value=value[1]))
        return tf.train.Feature(int64_list=tf.train.Int64List(value=value[1]))
    return tf.train.Example(features=tf.train.Features(
        feature={k: feature(v) for k, v in features.items()})).SerializeToString()


TF_FEATURES = {
    "image": ("bytes", [b"\x89PNG", b"", b"\x00" * 300]),
    "label": ("int64", [3]),
    "negative": ("int64", [-1, -(2**63), 2**63 - 1, 0, 127, 128, -128]),
    "scores": ("float", [0.5, -1.25, 3.0e38, 1e-30]),
    "empty_bytes": ("bytes", []),
    "empty_floats": ("float", []),
    "empty_ints": ("int64", []),
}


def assert_features_equal(parsed: dict, expected: dict) -> None:
    assert sorted(parsed) == sorted(expected)
    for key, (kind, values) in expected.items():
        got = parsed[key]
        dtype = {"bytes": object, "float": np.float32, "int64": np.int64}[kind]
        assert got.dtype == dtype, key
        assert got.tolist() == np.asarray(values, dtype=dtype).tolist(), key


def test_parse_example_matches_tensorflow(tf):
    record = tf_example(tf, TF_FEATURES)

    assert_features_equal(tfrecord.parse_example(record), TF_FEATURES)


def unpacked_example(features: dict) -> bytes:
    """tf.train.Example bytes with every number list written unpacked (one tag a value), as proto2
    writers and some other tools write them."""
    def delimited(field: int, payload: bytes) -> bytes:
        return _varint_bytes(field << 3 | 2) + _varint_bytes(len(payload)) + payload

    entries = b""
    for key, (kind, values) in features.items():
        if kind == "bytes":
            inner = delimited(1, b"".join(delimited(1, v) for v in values))
        elif kind == "float":
            inner = delimited(2, b"".join(b"\x0d" + struct.pack("<f", v) for v in values))
        else:
            inner = delimited(3, b"".join(b"\x08" + _varint_bytes(v & (2**64 - 1)) for v in values))
        entries += delimited(1, delimited(1, key.encode()) + delimited(2, inner))
    return delimited(1, entries)


def test_parse_example_reads_unpacked_lists_as_tensorflow_does(tf):
    record = unpacked_example(TF_FEATURES)
    from_tf = tf.train.Example.FromString(record)

    parsed = tfrecord.parse_example(record)

    assert_features_equal(parsed, TF_FEATURES)
    assert from_tf.features.feature["negative"].int64_list.value[:] == parsed["negative"].tolist()
    assert from_tf.features.feature["scores"].float_list.value[:] == parsed["scores"].tolist()


def test_encode_example_is_what_tensorflow_parses(tf):
    features = {"ints": np.array([[1, -2], [3, 2**40]]), "floats": np.array([0.25, -8.5]), "text": "héllo",
                "blobs": [b"a", b""], "flag": True, "empty": np.zeros(0, dtype=np.float32)}

    parsed = tf.train.Example.FromString(tfrecord.encode_example(features)).features.feature

    assert parsed["ints"].int64_list.value[:] == [1, -2, 3, 2**40]
    assert parsed["floats"].float_list.value[:] == [0.25, -8.5]
    assert parsed["text"].bytes_list.value[:] == ["héllo".encode()]
    assert parsed["blobs"].bytes_list.value[:] == [b"a", b""]
    assert parsed["flag"].int64_list.value[:] == [1]
    assert parsed["empty"].float_list.value[:] == []


def test_tfrecord_files_written_by_tensorflow_scan_and_read_at_every_position(tf, tmp_path):
    path = tmp_path / "shard.tfrecord"
    records = [tf_example(tf, {"i": ("int64", [i]), "pad": ("bytes", [b"p" * (37 * i)])}) for i in range(7)]
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    entry = entry_for(path, "tfrecord")

    order = [6, 0, 3, 3, 5, 1, 2, 4]
    assert read_all(path, entry, order=order) == [records[i] for i in order]
    assert [default_decode("tfrecord")(r)["i"].tolist() for r in read_all(path, entry)] == [[i] for i in
                                                                                             range(7)]


def test_frame_writes_what_tensorflow_writes(tf, tmp_path):
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(b"hello")
        writer.write(b"")

    assert path.read_bytes() == tfrecord.frame(b"hello") + tfrecord.frame(b"")


def test_tensorflow_reads_the_records_encode_writes(tf, tmp_path):
    path = tmp_path / "ours.tfrecord"
    with path.open("wb") as file:
        writer = tfrecord.Writer(file)
        writer.add(*tfrecord.encode({"x": np.array([[1.5, 2.5]], dtype=np.float32), "y": 4}, "k"))
        writer.close()
    spec = {"x": tf.io.FixedLenFeature([], tf.string), "x.dtype": tf.io.FixedLenFeature([], tf.string),
            "x.shape": tf.io.FixedLenFeature([2], tf.int64), "y": tf.io.FixedLenFeature([], tf.int64)}

    (record,) = list(tf.data.TFRecordDataset(str(path)))
    parsed = tf.io.parse_single_example(record, spec)

    assert tf.io.decode_raw(parsed["x"], tf.float32).numpy().tolist() == [1.5, 2.5]
    assert parsed["x.dtype"].numpy() == b"float32"
    assert parsed["x.shape"].numpy().tolist() == [1, 2]
    assert int(parsed["y"]) == 4


RAW_ARRAYS = {
    "f64": np.linspace(-1, 1, 24).reshape(2, 3, 4) * np.pi,
    "i64": np.array([[-(2**63), 2**63 - 1], [0, -1]], dtype=np.int64),
    "u8": np.arange(256, dtype=np.uint8).reshape(4, 8, 8),
    "flags": np.array([True, False, True]),
    "f64_0d": np.float64(np.pi),
    "u8_0d": np.array(7, dtype=np.uint8),
    "bool_0d": np.bool_(True),
    "i64_0d": np.array(-5, dtype=np.int64),
    "f16": np.array([0.5, -2.0], dtype=np.float16),
    "c128": np.array([[1 + 2j]], dtype=np.complex128),
    "u64": np.array([2**64 - 1], dtype=np.uint64),
    "big_endian": np.arange(6, dtype=">f8").reshape(3, 2),
    "strided": np.arange(20, dtype=np.int32).reshape(4, 5)[:, ::2],
    "empty": np.zeros((0, 3), dtype=np.float32),
}


def test_tfrecord_raw_arrays_come_back_with_their_dtype_shape_and_bits():
    decoded = default_decode("tfrecord")(tfrecord.encode_sample(RAW_ARRAYS))

    assert sorted(decoded) == sorted(RAW_ARRAYS)
    for key, value in RAW_ARRAYS.items():
        got, want = decoded[key], np.asarray(value)
        assert got.dtype == want.dtype.newbyteorder("="), key
        assert np.shape(got) == want.shape, key
        assert np.asarray(got).tobytes() == want.astype(want.dtype.newbyteorder("=")).tobytes(), key
        if want.ndim == 0:
            assert isinstance(got, np.generic), key
        else:
            assert got.flags.writeable, key


def test_tfrecord_raw_arrays_are_bytes_dtype_and_shape_features():
    features = tfrecord.parse_example(tfrecord.encode_sample({"x": np.arange(6, dtype=np.uint8).reshape(2, 3),
                                                              "s": np.float64(0.25)}))

    assert features["x"].tolist() == [bytes(range(6))]
    assert features["x.dtype"].tolist() == [b"uint8"] and features["x.shape"].tolist() == [2, 3]
    assert features["s"].tolist() == [struct.pack("<d", 0.25)]
    assert features["s.dtype"].tolist() == [b"float64"] and features["s.shape"].tolist() == []


def test_tensorflow_parse_example_and_decode_raw_read_the_raw_arrays(tf):
    records = [tfrecord.encode_sample({k: v for k, v in RAW_ARRAYS.items()
                                       if k not in ("u64", "empty")}) for _ in range(3)]
    keys = [k for k in RAW_ARRAYS if k not in ("u64", "empty")]
    spec = {k: tf.io.FixedLenFeature([], tf.string) for k in keys}
    spec |= {f"{k}.dtype": tf.io.FixedLenFeature([], tf.string) for k in keys}

    parsed = tf.io.parse_example(tf.constant(records), spec)

    for key in keys:
        want = np.asarray(RAW_ARRAYS[key])
        dtype = want.dtype.newbyteorder("=")
        assert {parsed[f"{key}.dtype"].numpy()[0]} == {dtype.name.encode()}
        got = tf.reshape(tf.io.decode_raw(parsed[key], tf.as_dtype(dtype.name)), (-1, *want.shape)).numpy()
        assert got.dtype == dtype, key
        assert got.shape == (3, *want.shape), key
        assert all(np.array_equal(row, want) for row in got), key


def test_tfrecord_records_of_int64_lists_still_read_as_before():
    legacy = tfrecord.encode_example({"image": np.arange(12, dtype=np.uint8), "image.shape": [3, 4],
                                      "score": 0.5, "score.shape": np.zeros(0, np.int64), "label": [2]})

    decoded = default_decode("tfrecord")(legacy)

    assert decoded["image"].dtype == np.int64 and decoded["image"].shape == (3, 4)
    assert decoded["image"].tolist() == np.arange(12).reshape(3, 4).tolist()
    assert decoded["score"] == np.float32(0.5) and isinstance(decoded["score"], np.float32)
    assert decoded["label"].tolist() == [2]
    assert sorted(decoded) == ["image", "label", "score"]


@pytest.mark.parametrize(("features", "match"), [
    ({"x": b"\x00" * 7, "x.dtype": "float64", "x.shape": [1]}, "7 bytes do not hold a float64 array"),
    ({"x": b"\x00" * 8, "x.dtype": "float64", "x.shape": [2]}, r"of shape \[2\]"),
    ({"x": b"\x00" * 8, "x.dtype": "object", "x.shape": [1]}, "not a NumPy numeric or bool"),
    ({"x": b"\x00" * 8, "x.dtype": "<f8", "x.shape": [1]}, "not a NumPy numeric or bool"),
    ({"x": [b"a", b"b"], "x.dtype": "uint8"}, "one bytes value"),
])
def test_a_bad_raw_array_is_refused_naming_the_feature(features, match):
    with pytest.raises(ValueError, match=match) as info:
        default_decode("tfrecord")(tfrecord.encode_example(features))
    assert "'x'" in str(info.value)


def test_tfrecord_default_decode_gives_shapes_back():
    sample = {"image": np.arange(12).reshape(3, 4), "label": 7, "score": np.float32(0.5), "name": "a",
              "raw": b"\x00\x01", "vector": np.array([1.0, 2.0], dtype=np.float32)}

    decoded = default_decode("tfrecord")(tfrecord.encode_sample(sample))

    assert decoded["image"].shape == (3, 4) and decoded["image"].tolist() == sample["image"].tolist()
    assert decoded["label"] == 7 and isinstance(decoded["label"], np.int64)
    assert decoded["score"] == np.float32(0.5)
    assert decoded["name"] == b"a" and decoded["raw"] == b"\x00\x01"
    assert decoded["vector"].tolist() == [1.0, 2.0]
    assert sorted(decoded) == sorted(sample)


def tfrecord_file(path: Path, count: int) -> Path:
    path.write_bytes(b"".join(tfrecord.frame(f"record {i}".encode() * (i + 1)) for i in range(count)))
    return path


def test_tfrecord_empty_and_one_record_shards(tmp_path):
    empty = tfrecord_file(tmp_path / "empty.tfrecord", 0)
    one = tfrecord_file(tmp_path / "one.tfrecord", 1)

    assert entry_for(empty, "tfrecord").num_samples == 0
    assert read_all(one, entry_for(one, "tfrecord")) == [b"record 0"]


@pytest.mark.parametrize(("damage", "words"), [
    ("length-crc", "bad CRC of the length"), ("data-crc", "bad CRC of the data"),
    ("cut-data", "truncated"), ("cut-header", "truncated")])
def test_a_damaged_tfrecord_is_one_line_naming_shard_and_record(tmp_path, damage, words):
    path = tfrecord_file(tmp_path / "shard.tfrecord", 3)
    data = bytearray(path.read_bytes())
    second = len(tfrecord.frame(b"record 0"))
    if damage == "length-crc":
        data[second + 9] ^= 0xFF
    elif damage == "data-crc":
        data[second + 13] ^= 0x01
    elif damage == "cut-data":
        data = data[:second + 15]
    else:
        data = data[:second + 5]
    path.write_bytes(bytes(data))

    assert_one_line_naming(scan_error(path, "tfrecord"), str(path), "record 1", words)


def test_a_tfrecord_damaged_after_indexing_is_one_line_on_read(tmp_path):
    path = tfrecord_file(tmp_path / "shard.tfrecord", 3)
    entry = entry_for(path, "tfrecord")
    data = bytearray(path.read_bytes())
    data[int(entry.offsets[2]) + 14] ^= 0x01
    path.write_bytes(bytes(data))

    assert read_all(path, entry, order=[0, 1]) == [b"record 0", b"record 1" * 2]
    with pytest.raises(ValueError) as info:
        read_all(path, entry, order=[2])
    assert_one_line_naming(str(info.value), "shard.tfrecord", "record 2", "bad CRC of the data")


def test_parse_example_refuses_what_is_not_an_example():
    with pytest.raises(ValueError, match=r"not a tf\.train\.Example"):
        tfrecord.parse_example(b"\x0a\xff\x01abc")


# --- Parquet -----------------------------------------------------------------------------------------------
def write_parquet(path: Path, rows: int, row_group_size: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"i": np.arange(rows), "text": [f"t{i}" for i in range(rows)],
                      "vector": pa.array([list(range(i % 4)) for i in range(rows)], pa.list_(pa.float32()))})
    pq.write_table(table, path, row_group_size=row_group_size)


def test_parquet_reads_every_row_in_any_order(tmp_path):
    path = tmp_path / "shard.parquet"
    write_parquet(path, 25, row_group_size=4)
    entry = entry_for(path, "parquet")
    order = list(np.random.default_rng(0).permutation(25))

    rows = read_all(path, entry, order=order)

    assert entry.offsets.tolist() == list(range(25))
    assert [row["i"] for row in rows] == order
    assert [row["text"] for row in rows] == [f"t{i}" for i in order]
    assert all(row["vector"].dtype == np.float32 and row["vector"].tolist() == list(range(i % 4))
               for row, i in zip(rows, order, strict=True))


def test_parquet_reads_a_row_group_once_for_its_rows(tmp_path):
    path = tmp_path / "shard.parquet"
    write_parquet(path, 12, row_group_size=4)
    reader = parquet_format.Reader(str(path), np.arange(12), "shard.parquet")
    groups_read = []
    original = reader._file.read_row_group
    reader._file.read_row_group = lambda g, *a, **k: groups_read.append(g) or original(g, *a, **k)

    for position in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 11, 8]:
        reader.read(position)
    reader.close()

    assert groups_read == [0, 1, 2]


def test_parquet_encode_round_trips_through_the_default_decode(tmp_path):
    path = tmp_path / "shard.parquet"
    samples = [{"image": np.full((2, 3), i, dtype=np.uint8), "vector": np.arange(i, dtype=np.int32),
                "label": i, "score": i / 4, "name": f"n{i}", "blob": bytes([i])} for i in range(5)]
    with path.open("wb") as file:
        writer = parquet_format.Writer(file)
        for sample in samples:
            writer.add(*parquet_format.encode(sample, "k"))
        writer.close()

    decoded = [default_decode("parquet")(raw) for raw in read_all(path, entry_for(path, "parquet"))]

    for sample, got in zip(samples, decoded, strict=True):
        assert got["image"].dtype == np.uint8 and got["image"].tolist() == sample["image"].tolist()
        assert got["vector"].dtype == np.int32 and got["vector"].tolist() == sample["vector"].tolist()
        assert {k: got[k] for k in ("label", "score", "name", "blob")} == \
            {k: sample[k] for k in ("label", "score", "name", "blob")}


def test_parquet_empty_and_one_row_shards(tmp_path):
    empty, one = tmp_path / "empty.parquet", tmp_path / "one.parquet"
    write_parquet(empty, 0, row_group_size=4)
    write_parquet(one, 1, row_group_size=4)

    assert entry_for(empty, "parquet").num_samples == 0
    assert [row["i"] for row in read_all(one, entry_for(one, "parquet"))] == [0]


def test_a_truncated_parquet_is_one_line_naming_the_shard(tmp_path):
    path = tmp_path / "shard.parquet"
    write_parquet(path, 10, row_group_size=4)
    path.write_bytes(path.read_bytes()[:-20])

    assert_one_line_naming(scan_error(path, "parquet"), str(path), "Parquet")


@pytest.mark.parametrize("count", [0, 1, 2, 5, 16, 17, 1000])
def test_int64_lists_of_any_length_and_range_round_trip(count):
    rng = np.random.default_rng(count)
    for values in (rng.integers(-(2**63), 2**63 - 1, count), rng.integers(0, 128, count),
                   rng.integers(-300, 300, count)):
        record = tfrecord.encode_example({"v": values})

        assert tfrecord.parse_example(record)["v"].tolist() == values.tolist()
