"""build_index and load_index on a flat-namespace Azure Blob container (Azurite) through adlfs, as a user
indexes shards uploaded to abfs:// or az://: versions are the blobs' ETags, and the index is one blob."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
import numpy as np
import pytest

from hvdazure.core import object_store
from hvdazure.data.formats import open_shard, parquet, tar, tfrecord
from hvdazure.data.index import INDEX_NAME, build_index, load_index


@pytest.fixture(autouse=True)
def _short_retry_delays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(object_store, "RETRY_DELAYS", (0.02, 0.05, 0.1))


def shard_bytes(module, count: int, tmp_path: Path, name: str) -> bytes:
    path = tmp_path / name
    with path.open("wb") as file:
        writer = module.Writer(file)
        for i in range(count):
            writer.add(*module.encode({"x": np.full((2, 2), i, dtype=np.int64), "cls": i}, f"{i:06d}"))
        writer.close()
    return path.read_bytes()


def upload(url: str, files: dict[str, bytes]) -> None:
    fs, root = fsspec.core.url_to_fs(url)
    for name, data in files.items():
        fs.pipe_file(f"{root}/{name}", data)


def shards(tmp_path: Path) -> dict[str, bytes]:
    return {"data/train/b.tar": shard_bytes(tar, 3, tmp_path, "b.tar"),
            "data/train/a.tfrecord": shard_bytes(tfrecord, 2, tmp_path, "a.tfrecord"),
            "data/train/c.parquet": shard_bytes(parquet, 4, tmp_path, "c.parquet"),
            "data/train/empty.tar": shard_bytes(tar, 0, tmp_path, "empty.tar"),
            "data/notes.txt": b"not a shard"}


def etag(url: str) -> str:
    fs, path = fsspec.core.url_to_fs(url)
    return str(fs.info(path)["etag"])


def test_build_index_on_blob_uses_etags_and_writes_the_index_blob(blob_url, tmp_path):
    files = shards(tmp_path)
    upload(blob_url, files)

    index = build_index(f"{blob_url}/data", progress=False)

    assert index.base == f"{blob_url}/data"
    assert [(e.path, e.format, e.num_samples) for e in index.shards] == [
        ("train/a.tfrecord", "tfrecord", 2), ("train/b.tar", "tar", 3), ("train/c.parquet", "parquet", 4),
        ("train/empty.tar", "tar", 0)]
    for entry in index.shards:
        assert entry.bytes == len(files[f"data/{entry.path}"])
        assert str(entry.version) == etag(index.url(entry))
    loaded = load_index(f"{blob_url}/data/{INDEX_NAME}")
    assert loaded == index and loaded.base == index.base
    assert [e.offsets.tolist() for e in loaded.shards] == [e.offsets.tolist() for e in index.shards]


def test_offsets_from_blob_read_the_same_shard_locally(blob_url, tmp_path):
    files = shards(tmp_path)
    upload(blob_url, files)
    index = build_index(f"{blob_url}/data", progress=False)
    entry = next(e for e in index.shards if e.path == "train/b.tar")
    local = tmp_path / "copy.tar"
    local.write_bytes(files["data/train/b.tar"])

    reader = open_shard(str(local), entry)
    assert [tar.decode(reader.read(p))["cls"] for p in (2, 0, 1)] == [2, 0, 1]
    reader.close()


def test_a_glob_on_blob_and_an_index_written_elsewhere(blob_url, tmp_path):
    upload(blob_url, shards(tmp_path))
    output = f"{blob_url}/indexes/tars.json"

    index = build_index(f"{blob_url}/data/train/*.tar", output=output, progress=False)

    assert [e.path for e in index.shards] == ["b.tar", "empty.tar"]
    fs, path = fsspec.core.url_to_fs(output)
    assert json.loads(fs.cat_file(path))["base"] == f"{blob_url}/data/train"
    assert load_index(output).base == f"{blob_url}/data/train"


def test_a_blob_overwritten_changes_the_fingerprint(blob_url, tmp_path):
    files = shards(tmp_path)
    upload(blob_url, files)
    before = build_index(f"{blob_url}/data", progress=False)
    upload(blob_url, {"data/train/b.tar": files["data/train/b.tar"]})  # the same bytes, a new ETag

    after = build_index(f"{blob_url}/data", progress=False)

    assert after.shards[1].bytes == before.shards[1].bytes
    assert after.shards[1].version != before.shards[1].version
    assert after.fingerprint() != before.fingerprint()


def test_az_urls_work_as_abfs_ones(blob_url, tmp_path):
    upload(blob_url, shards(tmp_path))
    az = blob_url.replace("abfs://", "az://")

    index = build_index(f"{az}/data", progress=False)

    assert index.base == f"{az}/data" and index.num_samples == 9
    assert load_index(f"{az}/data") == index


def test_a_container_prefix_without_shards_is_one_line_naming_it(blob_url):
    upload(blob_url, {"other/readme.txt": b"hello"})

    with pytest.raises(ValueError, match=f"no shards .* in {blob_url}/other$"):
        build_index(f"{blob_url}/other", progress=False)


def test_a_corrupt_blob_is_named(blob_url, tmp_path):
    data = shard_bytes(tfrecord, 3, tmp_path, "x.tfrecord")
    upload(blob_url, {"data/x.tfrecord": data[:-2]})

    with pytest.raises(ValueError, match=f"{blob_url}/data/x.tfrecord: record 2 .*truncated"):
        build_index(f"{blob_url}/data", progress=False)


def test_load_index_names_a_missing_index_blob(blob_url):
    with pytest.raises(FileNotFoundError, match=f"no index at {blob_url}/nothing/{INDEX_NAME}"):
        load_index(f"{blob_url}/nothing")


@pytest.mark.parametrize("fmt", ["tar", "tfrecord", "parquet"])
def test_write_shards_to_blob_uploads_whole_shards_and_the_index(blob_url, fmt):
    from hvdazure.data.writers import write_shards

    data = {"x": np.arange(20).reshape(10, 2), "y": np.arange(10)}

    written = write_shards(data, f"{blob_url}/out", fmt, samples_per_shard=4, progress=False)

    fs, root = fsspec.core.url_to_fs(f"{blob_url}/out")
    assert sorted(p.rsplit("/", 1)[1] for p in fs.find(root)) == [
        INDEX_NAME, f"shard-00000.{fmt}", f"shard-00001.{fmt}", f"shard-00002.{fmt}"]
    scanned = build_index(f"{blob_url}/out", output=f"{blob_url}/check.json", progress=False)
    assert load_index(f"{blob_url}/out") == written == scanned
    assert [e.offsets.tolist() for e in written.shards] == [e.offsets.tolist() for e in scanned.shards]
    assert all(str(e.version) == etag(written.url(e)) for e in written.shards)


def test_pack_folder_to_blob_writes_classes_next_to_the_index(blob_url, tmp_path):
    from hvdazure.data.writers import pack_folder

    for cls in ("b", "a"):
        (tmp_path / "images" / cls).mkdir(parents=True)
        (tmp_path / "images" / cls / "1.jpg").write_bytes(cls.encode())

    index = pack_folder(str(tmp_path / "images"), f"{blob_url}/packed", "tar", progress=False)

    fs, root = fsspec.core.url_to_fs(f"{blob_url}/packed")
    assert json.loads(fs.cat_file(f"{root}/classes.json")) == ["a", "b"]
    assert index.num_samples == 2


def test_write_shards_refuses_a_prefix_holding_shards(blob_url, tmp_path):
    from hvdazure.data.writers import write_shards

    upload(blob_url, {"out/old.tar": shard_bytes(tar, 1, tmp_path, "old.tar")})

    with pytest.raises(ValueError, match=f"{blob_url}/out already holds shards .*old.tar"):
        write_shards({"x": np.arange(3)}, f"{blob_url}/out", progress=False)
