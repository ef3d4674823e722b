"""The index of a sharded dataset: built from a directory, a glob or a file; reproducible; saved and
loaded; its fingerprint follows the shards; select(glob); clear errors for no shards and bad shards."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from hvdazure.data.formats import tar, tfrecord
from hvdazure.data.index import INDEX_NAME, ShardEntry, ShardIndex, build_index, load_index


def write_tar(path: Path, count: int, payload: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as file:
        writer = tar.Writer(file)
        for i in range(count):
            writer.add(*tar.encode({"bin": payload * (i + 1), "cls": i}, f"{i:06d}"))
        writer.close()
    return path


def write_tfrecord(path: Path, count: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(tfrecord.frame(tfrecord.encode_example({"i": i})) for i in range(count)))
    return path


def dataset(root: Path) -> Path:
    write_tar(root / "train" / "shard-00001.tar", 3)
    write_tar(root / "train" / "shard-00000.tar", 2)
    write_tfrecord(root / "val" / "v.tfrecord", 4)
    (root / "README.md").write_text("not a shard")
    (root / "classes.json").write_text("[]")
    return root


def test_build_index_lists_shards_sorted_and_writes_the_index_next_to_them(tmp_path):
    root = dataset(tmp_path / "data")

    index = build_index(str(root), progress=False)

    assert [e.path for e in index.shards] == ["train/shard-00000.tar", "train/shard-00001.tar",
                                               "val/v.tfrecord"]
    assert [e.num_samples for e in index.shards] == [2, 3, 4]
    assert [e.format for e in index.shards] == ["tar", "tar", "tfrecord"]
    assert index.num_samples == 9
    assert index.base == str(root)
    assert (root / INDEX_NAME).exists()


def test_the_index_records_size_version_and_offsets(tmp_path):
    root = dataset(tmp_path / "data")
    stat = (root / "val" / "v.tfrecord").stat()

    entry = build_index(str(root), progress=False).shards[2]

    assert entry.bytes == stat.st_size
    assert str(entry.version) == f"{stat.st_mtime_ns}:{stat.st_size}"
    record = len(tfrecord.frame(tfrecord.encode_example({"i": 0})))
    assert entry.offsets.dtype == np.int64 and entry.offsets.tolist() == [0, record, 2 * record, 3 * record]


def test_load_index_gives_back_what_build_index_made(tmp_path):
    root = dataset(tmp_path / "data")
    built = build_index(str(root), progress=False)

    for url in (str(root), str(root / INDEX_NAME), f"file://{root}"):
        loaded = load_index(url)
        assert loaded == built
        assert loaded.fingerprint() == built.fingerprint()
        assert [e.offsets.tolist() for e in loaded.shards] == [e.offsets.tolist() for e in built.shards]


def test_the_json_layout(tmp_path):
    root = dataset(tmp_path / "data")
    build_index(str(root), progress=False)

    document = json.loads((root / INDEX_NAME).read_text())

    assert document["format_version"] == 1
    assert document["created_by"].startswith("hvdazure ")
    assert "base" not in document  # the index's own directory: data and index move together
    assert set(document["shards"][0]) == {"path", "format", "num_samples", "bytes", "version", "offsets"}


def test_building_twice_gives_the_same_index_file(tmp_path):
    root = dataset(tmp_path / "data")
    build_index(str(root), progress=False)
    first = (root / INDEX_NAME).read_bytes()
    build_index(str(root), progress=False)

    assert (root / INDEX_NAME).read_bytes() == first


def test_a_glob_selects_shards_and_the_base_is_above_its_wildcard(tmp_path):
    root = dataset(tmp_path / "data")

    index = build_index(str(root / "train" / "*.tar"), progress=False)

    assert [e.path for e in index.shards] == ["shard-00000.tar", "shard-00001.tar"]
    assert index.base == str(root / "train")


def test_a_single_file_is_a_source(tmp_path):
    root = dataset(tmp_path / "data")

    index = build_index(str(root / "val" / "v.tfrecord"), progress=False)

    assert [(e.path, e.num_samples) for e in index.shards] == [("v.tfrecord", 4)]


def test_output_elsewhere_records_the_base(tmp_path):
    root = dataset(tmp_path / "data")
    elsewhere = tmp_path / "indexes" / "mine.json"

    build_index(str(root), output=str(elsewhere), progress=False)
    loaded = load_index(str(elsewhere))

    assert not (root / INDEX_NAME).exists()
    assert json.loads(elsewhere.read_text())["base"] == str(root)
    assert loaded.base == str(root)
    assert loaded.url(loaded.shards[0]) == f"{root}/train/shard-00000.tar"


def test_the_fingerprint_changes_when_a_shard_changes(tmp_path):
    root = dataset(tmp_path / "data")
    before = build_index(str(root), progress=False)
    shard = root / "train" / "shard-00001.tar"
    stat = shard.stat()
    write_tar(shard, 3, payload=b"y")  # same samples and size, other bytes
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))

    after = build_index(str(root), progress=False)

    assert after.shards[1].bytes == before.shards[1].bytes
    assert after.shards[1].version != before.shards[1].version
    assert after.fingerprint() != before.fingerprint()
    assert build_index(str(root), progress=False).fingerprint() == after.fingerprint()


def test_select_keeps_the_shards_a_glob_matches_in_order(tmp_path):
    index = build_index(str(dataset(tmp_path / "data")), progress=False)

    assert [e.path for e in index.select("train/*").shards] == ["train/shard-00000.tar",
                                                                "train/shard-00001.tar"]
    assert index.select("*.tfrecord").num_samples == 4
    assert index.select("train/*").base == index.base


def test_select_matching_nothing_names_the_pattern(tmp_path):
    index = build_index(str(dataset(tmp_path / "data")), progress=False)

    with pytest.raises(ValueError, match=r"'test/\*'"):
        index.select("test/*")


def test_an_empty_shard_is_in_the_index(tmp_path):
    write_tar(tmp_path / "a.tar", 0)
    write_tar(tmp_path / "b.tar", 2)

    index = build_index(str(tmp_path), progress=False)

    assert [(e.path, e.num_samples) for e in index.shards] == [("a.tar", 0), ("b.tar", 2)]
    assert load_index(str(tmp_path)).shards[0].offsets.shape == (0,)


def test_no_shard_at_all_is_one_line_naming_the_source(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")

    with pytest.raises(ValueError, match=f"no shards .* in {tmp_path}$"):
        build_index(str(tmp_path), progress=False)


def test_a_missing_source_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        build_index(str(tmp_path / "nowhere"), progress=False)


def test_a_glob_matching_a_file_of_another_suffix_names_it(tmp_path):
    write_tar(tmp_path / "a.tar", 1)
    (tmp_path / "a.zip").write_bytes(b"zip")

    with pytest.raises(ValueError, match=r"a\.zip"):
        build_index(str(tmp_path / "a.*"), progress=False)


def test_a_corrupt_shard_stops_the_build_naming_it(tmp_path):
    write_tar(tmp_path / "good.tar", 2)
    bad = write_tfrecord(tmp_path / "bad.tfrecord", 3)
    bad.write_bytes(bad.read_bytes()[:-3])

    with pytest.raises(ValueError, match=f"{tmp_path}/bad.tfrecord: record 2 .*truncated"):
        build_index(str(tmp_path), progress=False)
    assert not (tmp_path / INDEX_NAME).exists()


def test_progress_shows_a_bar_on_stderr(tmp_path, capsys):
    build_index(str(dataset(tmp_path / "data")), progress=True)

    assert "indexing" in capsys.readouterr().err


def test_load_index_names_a_missing_index(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no index at {tmp_path}/{INDEX_NAME}.*hvdazure data index"):
        load_index(str(tmp_path))


def test_load_index_names_a_file_that_is_not_an_index(tmp_path):
    (tmp_path / INDEX_NAME).write_text('{"format_version": 99, "shards": []}')

    with pytest.raises(ValueError, match=f"{tmp_path}/{INDEX_NAME}: not an hvdazure index"):
        load_index(str(tmp_path))


def test_entries_compare_by_identity_not_offsets_and_offsets_are_read_only():
    a = ShardEntry("a.tar", "tar", 2, 100, "1:100", np.array([0, 10]))
    b = ShardEntry("a.tar", "tar", 2, 100, "1:100", [0, 50])

    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != ShardEntry("a.tar", "tar", 2, 100, "2:100", [0, 10])
    with pytest.raises(ValueError):
        a.offsets[0] = 5


def test_an_entry_must_have_one_offset_a_sample():
    with pytest.raises(ValueError, match=r"a\.tar: 1 offsets for 2 samples"):
        ShardEntry("a.tar", "tar", 2, 100, "v", [0])


def test_num_samples_sums_the_shards():
    index = ShardIndex("/d", (ShardEntry("a.tar", "tar", 2, 10, "v", [0, 5]),
                              ShardEntry("b.tar", "tar", 0, 10, "v", [])))

    assert index.num_samples == 2 and index.num_bytes == 20


def test_the_offsets_of_a_gnu_tar_are_its_member_headers(tmp_path):
    path = tmp_path / "gnu.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as archive:
        for name in ("a.txt", "b.txt"):
            info = tarfile.TarInfo(name)
            archive.addfile(info)

    assert build_index(str(tmp_path), progress=False).shards[0].offsets.tolist() == [0, 512]


def test_importing_hvdazure_data_loads_neither_pyarrow_fsspec_nor_numpy():
    import subprocess
    import sys

    probe = ("import sys, hvdazure.data\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'fsspec', 'numpy', "
             "'google_crc32c')))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)

    assert proc.stdout.strip() == "[]"
