"""Shards on this machine: read in place from a local disk (checked against the index first), copied whole
into the cache from a FUSE mount (Azure ML's mount mode), and where a source string says they are."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest
from shard_files import indexed_shard

from hvdazure.data import source as source_module
from hvdazure.data.cache import LocalShards, ShardCache, ShardError, open_shards
from hvdazure.data.index import ShardEntry, ShardIndex
from hvdazure.data.sizes import parse_size
from hvdazure.data.source import MissingIndexError, is_fuse_mounted, resolve_source


def _pretend_fuse(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mount: Path) -> None:
    """/proc/self/mountinfo as Azure ML's mount mode leaves it, with `mount` as the input's mount point."""
    text = ("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
            f"98 22 0:52 / {mount} ro,nosuid,nodev,relatime shared:50 - fuse rslex-fuse ro,user_id=0\n")
    (tmp_path / "mountinfo").write_text(text)
    monkeypatch.setattr(source_module, "_MOUNTINFO", str(tmp_path / "mountinfo"))


# --- a local directory: read in place ----------------------------------------------------------------------
def test_a_local_directory_is_read_in_place_without_a_copy(tmp_path: Path) -> None:
    entry = indexed_shard(tmp_path / "data", "train/shard-0.tar", b"x" * 100)
    shards = open_shards(ShardIndex(str(tmp_path / "data"), (entry,)))

    assert isinstance(shards, LocalShards)
    assert shards.local_path(entry) == str(tmp_path / "data" / "train" / "shard-0.tar")


CHANGES = {
    "rewritten with another size": (lambda p: p.write_bytes(b"y" * 50),
                                    r"has 50 bytes, the index says 100 \(truncated, or changed since"),
    "touched (another mtime)": (lambda p: os.utime(p, ns=(1, 1)),
                                r"changed since indexing \(run 'hvdazure data index' again\)$"),
    "deleted": (lambda p: p.unlink(), r"is missing"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_local_shard_changed_since_indexing_is_one_line_naming_it(tmp_path: Path, change: str) -> None:
    entry = indexed_shard(tmp_path, "shard-0.tar", b"x" * 100)
    damage, message = CHANGES[change]
    damage(tmp_path / "shard-0.tar")

    with pytest.raises(ShardError, match=message) as error:
        LocalShards(str(tmp_path)).local_path(entry)
    assert str(error.value).startswith(f"shard {tmp_path / 'shard-0.tar'} ") and "\n" not in str(error.value)


def test_an_index_of_etags_read_from_a_local_copy_is_checked_by_size(tmp_path: Path) -> None:
    # Indexed on Blob, then downloaded (an Azure ML input in download mode): no mtime to compare with.
    local = indexed_shard(tmp_path, "shard-0.tar", b"x" * 100)
    indexed_on_blob = ShardEntry(local.path, "tar", 1, 100, '"0x8DC1A2B3C4D5E6F"', offsets=local.offsets)
    shards = LocalShards(str(tmp_path))

    assert shards.local_path(indexed_on_blob) == str(tmp_path / "shard-0.tar")
    (tmp_path / "shard-0.tar").write_bytes(b"x" * 99)
    with pytest.raises(ShardError, match="has 99 bytes, the index says 100"):
        LocalShards(str(tmp_path)).local_path(indexed_on_blob)


def _read_in_forked_child(cache: ShardCache, entries: list[ShardEntry], results: Any) -> None:
    paths = [cache.local_path(entry) for entry in entries]
    results.put((paths, cache.stats.downloads, len(cache._threads)))


def test_a_forked_copy_of_a_cache_starts_afresh_and_reads_through_the_same_files(tmp_path: Path) -> None:
    # What a DataLoader worker started by fork gets: the parent's object, its prefetch thread not running.
    entries = [indexed_shard(tmp_path / "data", f"shard-{n}.tar", bytes([n]) * 100) for n in range(2)]
    cache = ShardCache(str(tmp_path / "data"), str(tmp_path / "cache"))
    cache.prefetch(entries[:1])
    deadline = time.monotonic() + 10
    while not cache.is_cached(entries[0]):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_read_in_forked_child, args=(cache, entries, results))
    child.start()
    paths, downloads, threads = results.get(timeout=30)
    child.join(30)
    cache.close()

    assert child.exitcode == 0 and paths == [cache.local_path(entry) for entry in entries]
    assert (downloads, threads) == (1, 0)  # only the shard the parent had not fetched


def test_cache_true_copies_even_local_shards_into_the_cache(tmp_path: Path) -> None:
    entry = indexed_shard(tmp_path / "data", "shard-0.tar", b"x" * 100)
    shards = open_shards(ShardIndex(str(tmp_path / "data"), (entry,)), cache=True,
                         cache_dir=str(tmp_path / "cache"), limit_bytes="1MB")

    assert isinstance(shards, ShardCache) and shards.limit_bytes == 1_000_000
    assert shards.local_path(entry).startswith(str(tmp_path / "cache"))


def test_an_unknown_cache_choice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cache must be 'auto', True or False, got 'yes'"):
        open_shards(ShardIndex(str(tmp_path), ()), cache="yes")


# --- an Azure ML mount: FUSE, so copied whole --------------------------------------------------------------
def test_a_fuse_mount_is_recognised_from_mountinfo() -> None:
    mountinfo = ("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
                 "98 22 0:52 / /mnt/azureml/cr/j/abc/cap/data-capability/wd/INPUT\\040data ro "
                 "- fuse.blobfuse2 blobfuse2 ro\n")

    assert is_fuse_mounted("/mnt/azureml/cr/j/abc/cap/data-capability/wd/INPUT data/train", mountinfo)
    assert not is_fuse_mounted("/mnt/azureml/cr/j/abc/exe/wd", mountinfo)
    assert not is_fuse_mounted("/home/user/data", mountinfo)


def test_shards_on_a_fuse_mount_are_copied_whole_into_the_cache_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mount = tmp_path / "INPUT_data"
    entries = [indexed_shard(mount, f"shard-{n}.tar", bytes([n]) * 1000) for n in range(2)]
    _pretend_fuse(monkeypatch, tmp_path, mount)
    monkeypatch.setenv("HVDAZURE_CACHE_DIR", str(tmp_path / "cache"))

    shards = open_shards(ShardIndex(str(mount), tuple(entries)))

    assert isinstance(shards, ShardCache) and resolve_source(str(mount)).needs_cache
    paths = [shards.local_path(entry) for entry in entries]
    assert [Path(path).read_bytes() for path in paths] == [bytes([n]) * 1000 for n in range(2)]
    assert all(path.startswith(str(tmp_path / "cache")) for path in paths)
    assert shards.local_path(entries[0]) == paths[0]
    assert (shards.stats.downloads, shards.stats.hits) == (2, 1)


def test_a_mounted_shard_changed_since_indexing_is_not_copied(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    mount = tmp_path / "INPUT_data"
    entry = indexed_shard(mount, "shard-0.tar", b"x" * 100)
    os.utime(mount / "shard-0.tar", ns=(1, 1))
    _pretend_fuse(monkeypatch, tmp_path, mount)

    shards = open_shards(ShardIndex(str(mount), (entry,)), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ShardError, match=f"shard {mount}/shard-0.tar changed since indexing"):
        shards.local_path(entry)
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and p.suffix != ".lock"] == []


# --- where a source's index is -----------------------------------------------------------------------------
def test_a_directory_an_index_file_and_a_glob_name_their_index(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()

    directory = resolve_source(str(tmp_path / "train"))
    index_file = resolve_source(str(tmp_path / "elsewhere.json"))
    pattern = resolve_source(str(tmp_path / "train" / "shard-*.tar"))

    assert (directory.index_url, directory.base, directory.pattern) == (
        str(tmp_path / "train" / "hvdazure-index.json"), str(tmp_path / "train"), None)
    assert (index_file.index_url, index_file.base) == (str(tmp_path / "elsewhere.json"), str(tmp_path))
    assert (pattern.index_url, pattern.base, pattern.pattern) == (
        str(tmp_path / "train" / "hvdazure-index.json"), str(tmp_path / "train"), "shard-*.tar")
    assert not (directory.needs_cache or index_file.needs_cache or pattern.needs_cache)


def test_a_missing_index_is_one_line_saying_what_to_run(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    messages = {}
    for source in ("train", "train/shard-*.tar", "train/", "index.json"):
        with pytest.raises(MissingIndexError) as error:
            resolve_source(str(tmp_path / source)).load_index()
        messages[source] = str(error.value)

    directory = (f"no index at {tmp_path}/train/hvdazure-index.json: run 'hvdazure data index "
                 f"{tmp_path}/train' first")
    assert messages == {"train": directory, "train/shard-*.tar": directory, "train/": directory,
                        "index.json": f"no index at {tmp_path}/index.json: run 'hvdazure data index SHARDS "
                                      f"--output {tmp_path}/index.json' first"}


def test_a_source_that_does_not_exist_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"source {tmp_path}/nothing: no such file or directory"):
        resolve_source(str(tmp_path / "nothing"))


# --- sizes -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "expected"), [("20GB", 20 * 10**9), ("500 MB", 500 * 10**6),
                                                ("64MiB", 64 << 20), ("1.5gb", 1_500_000_000), ("1024", 1024),
                                                (4096, 4096)])
def test_a_size_limit_is_read_as_users_write_it(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["20 parsecs", "GB", "-1", -1, True])
def test_a_size_that_is_not_one_is_named(text: str | int) -> None:
    with pytest.raises(ValueError, match="the cache size limit"):
        parse_size(text, "the cache size limit")
