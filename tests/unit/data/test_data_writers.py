"""write_shards and pack_folder: what goes in comes back through the default decode, in order, for each
format; shards split by size or count; the index written matches a fresh scan; bad input is refused."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from hvdazure.data.formats import default_decode, open_shard
from hvdazure.data.index import INDEX_NAME, build_index, load_index
from hvdazure.data.sizes import parse_size
from hvdazure.data.writers import CLASSES_NAME, pack_folder, write_shards

FORMATS = ["tar", "tfrecord", "parquet"]


def decoded(index) -> list[dict]:
    """Every sample of an index, decoded by its format's default, in global order."""
    out = []
    for entry in index.shards:
        reader = open_shard(f"{index.base}/{entry.path}", entry)
        out += [default_decode(entry.format)(reader.read(p)) for p in range(entry.num_samples)]
        reader.close()
    return out


def arrays(n: int = 10) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"image": rng.integers(0, 255, size=(n, 4, 3), dtype=np.uint8).astype(np.float32),
            "label": np.arange(n) % 3, "weights": rng.normal(size=(n, 5)).astype(np.float32)}


@pytest.mark.parametrize("fmt", FORMATS)
def test_arrays_round_trip_in_order(tmp_path, fmt):
    data = arrays()

    index = write_shards(data, str(tmp_path / "out"), fmt, samples_per_shard=4, progress=False)
    samples = decoded(index)

    assert [e.num_samples for e in index.shards] == [4, 4, 2]
    assert [e.path for e in index.shards] == [f"shard-0000{i}.{fmt}" for i in range(3)]
    for i, sample in enumerate(samples):
        assert np.array_equal(sample["image"], data["image"][i]) and sample["image"].shape == (4, 3)
        assert np.array_equal(sample["weights"], data["weights"][i])
        assert int(sample["label"]) == data["label"][i]


def test_tfrecord_keeps_each_arrays_dtype_and_shape(tmp_path):
    rng = np.random.default_rng(1)
    data = {"f64": rng.normal(size=(6, 2, 3, 4)), "u8": rng.integers(0, 256, (6, 5), dtype=np.uint8),
            "flags": rng.integers(0, 2, (6, 3)).astype(bool), "i64": rng.integers(-2**62, 2**62, (6, 2, 2)),
            "score": rng.normal(size=6)}  # a float64 column: a 0-d float64 a sample

    samples = decoded(write_shards(data, str(tmp_path / "out"), "tfrecord", samples_per_shard=4,
                                   progress=False))

    for i, sample in enumerate(samples):
        assert sorted(sample) == sorted(data)
        for key, column in data.items():
            assert sample[key].dtype == column.dtype and np.shape(sample[key]) == column.shape[1:], key
            assert np.asarray(sample[key]).tobytes() == column[i].tobytes(), key


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_index_written_is_what_a_fresh_scan_finds(tmp_path, fmt):
    out = tmp_path / "out"
    written = write_shards(arrays(9), str(out), fmt, samples_per_shard=4, progress=False)
    loaded = load_index(str(out))
    (out / INDEX_NAME).unlink()

    scanned = build_index(str(out), progress=False)

    assert loaded == written == scanned
    assert [e.offsets.tolist() for e in written.shards] == [e.offsets.tolist() for e in scanned.shards]
    assert written.fingerprint() == scanned.fingerprint()


@pytest.mark.parametrize("fmt", FORMATS)
def test_shard_size_bounds_each_shard(tmp_path, fmt):
    data = {"blob": [bytes([i]) * 3000 for i in range(12)], "label": list(range(12))}

    index = write_shards(data, str(tmp_path / "out"), fmt, shard_size="10KB", progress=False)

    assert len(index.shards) > 2
    assert index.num_samples == 12
    if fmt != "parquet":  # Parquet's size is an estimate before compression
        assert all(e.bytes <= 10_000 + 10240 for e in index.shards)  # a tar's end blocks and padding
    assert [s["blob"] for s in decoded(index)] == data["blob"]


def test_a_sample_larger_than_the_shard_size_gets_a_shard_of_its_own(tmp_path):
    data = {"blob": [b"a" * 100, b"b" * 5000, b"c" * 100]}

    index = write_shards(data, str(tmp_path / "out"), "tfrecord", shard_size=1000, progress=False)

    assert [e.num_samples for e in index.shards] == [1, 1, 1]


class MapStyle:
    """A map-style dataset as torch has them (only __len__ and __getitem__), of (x, y) tuples."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full((2, 2), i, dtype=np.int64), i


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_map_style_dataset_of_tuples_gives_fields_0_and_1(tmp_path, fmt):
    samples = decoded(write_shards(MapStyle(), str(tmp_path / "out"), fmt, progress=False))

    assert [int(s["1"]) for s in samples] == [0, 1, 2, 3, 4]
    assert all(np.array_equal(s["0"], np.full((2, 2), i)) for i, s in enumerate(samples))


def test_an_iterable_of_dicts_of_any_values(tmp_path):
    def generate():
        for i in range(3):
            yield {"text": f"t{i}", "score": 0.25 * i, "jpg": b"\xff" * i, "meta": {"i": i}}

    samples = decoded(write_shards(generate(), str(tmp_path / "out"), "tar", progress=False))

    assert [{k: v for k, v in s.items() if k != "__key__"} for s in samples] == list(generate())
    assert [s["__key__"] for s in samples] == ["000000000", "000000001", "000000002"]


def test_a_tuple_of_arrays(tmp_path):
    x, y = np.arange(6).reshape(3, 2), np.array([7, 8, 9])

    samples = decoded(write_shards((x, y), str(tmp_path / "out"), "parquet", progress=False))

    assert [s["0"].tolist() for s in samples] == x.tolist()
    assert [s["1"] for s in samples] == [7, 8, 9]


def test_a_torch_dataset_of_tensors_gives_arrays(tmp_path):
    torch = pytest.importorskip("torch")
    dataset = torch.utils.data.TensorDataset(torch.ones(3, 2, dtype=torch.float64), torch.tensor([4, 5, 6]))

    samples = decoded(write_shards(dataset, str(tmp_path / "out"), "tar", progress=False))

    assert [s["0"].tolist() for s in samples] == [[1.0, 1.0]] * 3
    assert [s["1"] for s in samples] == [4, 5, 6]  # integer scalars: ints, stored as .cls
    assert all(isinstance(s["1"], int) for s in samples)


def test_one_sample_makes_one_shard(tmp_path):
    index = write_shards([{"x": np.zeros(3)}], str(tmp_path / "out"), "tfrecord", progress=False)

    assert [e.num_samples for e in index.shards] == [1]


def test_no_temporary_file_stays_and_a_failure_writes_no_index(tmp_path):
    out = tmp_path / "out"
    samples = [{"x": 1}, {"x": 2}, {"x": object()}]

    with pytest.raises(TypeError, match="field 'x'"):
        write_shards(samples, str(out), "tar", samples_per_shard=1, progress=False)

    assert sorted(os.listdir(out)) == ["shard-00000.tar"]  # shard 1 was being written: dropped


def test_an_output_holding_shards_is_refused(tmp_path):
    write_shards({"x": np.arange(3)}, str(tmp_path), "tar", progress=False)

    with pytest.raises(ValueError, match=f"{tmp_path} already holds shards .*shard-00000.tar"):
        write_shards({"x": np.arange(3)}, str(tmp_path), "tar", progress=False)


def test_first_dimensions_must_agree(tmp_path):
    with pytest.raises(ValueError, match=re.escape("first dimensions differ: {'x': 3, 'y': 2}")):
        write_shards({"x": np.arange(3), "y": np.arange(2)}, str(tmp_path), progress=False)


def test_nothing_to_write_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no samples"):
        write_shards([], str(tmp_path), progress=False)
    assert not (tmp_path / INDEX_NAME).exists()


def test_shard_size_and_samples_per_shard_are_one_or_the_other(tmp_path):
    with pytest.raises(ValueError, match="not both"):
        write_shards({"x": np.arange(3)}, str(tmp_path), shard_size="1MB", samples_per_shard=2)


def test_an_unknown_format_is_refused(tmp_path):
    with pytest.raises(ValueError, match="'zip'"):
        write_shards({"x": np.arange(3)}, str(tmp_path), "zip")


@pytest.mark.parametrize(("text", "size"), [("64MB", 64 * 10**6), ("64MiB", 64 * 2**20), ("1.5 GB", 1.5e9),
                                            ("4096", 4096), (4096, 4096), ("10kb", 10_000), ("2K", 2000)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["64XB", "", "MB", "-3MB", "0", "1e3"])
def test_parse_size_names_a_bad_size(text):
    with pytest.raises(ValueError, match=f"bad size {text!r}"):
        parse_size(text)


# --- pack_folder -------------------------------------------------------------------------------------------
def image_folder(root: Path) -> Path:
    for cls, names in {"dog": ["a.jpg", "b.jpg", "sub/c.jpg"], "cat": ["x.png", "y.jpg"],
                       "emu": ["z.JPG"]}.items():
        for name in names:
            path = root / cls / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f"{cls}/{name}".encode())
    (root / ".hidden").mkdir()
    return root


@pytest.mark.parametrize("fmt", FORMATS)
def test_pack_folder_makes_one_sample_a_file_with_its_class(tmp_path, fmt):
    folder = image_folder(tmp_path / "images")
    out = tmp_path / "out"

    index = pack_folder(str(folder), str(out), fmt, samples_per_shard=2, progress=False)
    samples = decoded(index)

    assert json.loads((out / CLASSES_NAME).read_text()) == ["cat", "dog", "emu"]
    assert index.num_samples == 6 and len(index.shards) == 3
    got = set()
    for sample in samples:
        content = next(bytes(v) for k, v in sample.items() if k in ("jpg", "png") and v is not None)
        ext = next(k for k, v in sample.items() if k in ("jpg", "png") and v is not None)
        got.add((content.decode(), ext, int(sample["cls"])))
    assert got == {("cat/x.png", "png", 0), ("cat/y.jpg", "jpg", 0), ("dog/a.jpg", "jpg", 1),
                   ("dog/b.jpg", "jpg", 1), ("dog/sub/c.jpg", "jpg", 1), ("emu/z.JPG", "jpg", 2)}


def test_pack_folder_shuffles_with_a_fixed_seed_or_keeps_class_order(tmp_path):
    folder = image_folder(tmp_path / "images")

    def contents(out: str, **options) -> list[bytes]:
        index = pack_folder(str(folder), str(tmp_path / out), "tar", progress=False, **options)
        return [next(v for k, v in s.items() if k in ("jpg", "png")) for s in decoded(index)]

    first, again, ordered = contents("a"), contents("b"), contents("c", shuffle=False)

    assert first == again
    assert ordered == [b"cat/x.png", b"cat/y.jpg", b"dog/a.jpg", b"dog/b.jpg", b"dog/sub/c.jpg", b"emu/z.JPG"]
    assert sorted(first) == sorted(ordered)
    shard = "shard-00000.tar"
    assert (tmp_path / "a" / shard).read_bytes() == (tmp_path / "b" / shard).read_bytes()


def test_pack_folder_names_a_missing_folder_and_one_without_classes(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        pack_folder(str(tmp_path / "nowhere"), str(tmp_path / "out"))
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(b"x")
    with pytest.raises(ValueError, match="no class subfolders"):
        pack_folder(str(tmp_path / "flat"), str(tmp_path / "out"))
