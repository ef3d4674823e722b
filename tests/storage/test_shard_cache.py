"""The node-local shard cache against a real Blob endpoint (Azurite), reached as abfs:// through adlfs and,
where faults or request counts matter, through the fault proxy: whole shards downloaded once per node and
verified, transient faults retried, a missing / truncated / changed shard one line with nothing cached,
killed downloads never taken for complete, eviction under a limit, read-ahead in order.
"""

from __future__ import annotations

import io
import multiprocessing
import multiprocessing.connection
import os
import pickle
import random
import re
import signal
import tarfile
import time
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

from hvdazure.core import object_store
from hvdazure.core.object_store import StorageError
from hvdazure.data import cache as cache_module
from hvdazure.data.cache import ShardCache, ShardError, open_shards
from hvdazure.data.index import ShardEntry, ShardIndex, build_index
from hvdazure.data.source import MissingIndexError, resolve_source, shard_version
from storage.azurite import shorten_sdk_backoff
from storage.conftest import ProxiedBlob
from storage.fault_proxy import Request

ROOT = Path(__file__).resolve().parents[2]
CHUNK = 64 << 10  # the cache's range-request size in these tests: a 200 kB shard takes 4 GETs
SHARD_BYTES = 200_000


@pytest.fixture(autouse=True)
def _short_retries_and_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """hvdazure's and the SDK's retries wait hundredths of a second here (the fixture's shortened backoff
    shortened 10x more), and shards download in several chunks."""
    monkeypatch.setattr(object_store, "RETRY_DELAYS", (0.02, 0.05, 0.1))
    shorten_sdk_backoff(monkeypatch, 0.1)
    monkeypatch.setattr(cache_module, "_CHUNK", CHUNK)


def _shard_bytes(number: int, size: int = SHARD_BYTES) -> bytes:
    return (f"shard {number} ".encode() * (size // 8 + 1))[:size]


def _upload(base: str, name: str, data: bytes) -> ShardEntry:
    """Put a shard into storage and index it as the index builder does: its size and ETag now. The cache
    never parses a shard: plain bytes do, as one sample of a tar."""
    fs, root = fsspec.core.url_to_fs(base)
    fs.pipe_file(f"{root}/{name}", data)
    size, version = shard_version(fs, f"{root}/{name}")
    return ShardEntry(name, "tar", 1, size, version, offsets=np.zeros(1, dtype=np.int64))


def _shards(base: str, count: int, size: int = SHARD_BYTES) -> list[ShardEntry]:
    return [_upload(base, f"train/shard-{n:05d}.tar", _shard_bytes(n, size)) for n in range(count)]


def _gets(proxied: ProxiedBlob, name: str) -> list[Request]:
    """The GETs of a shard's bytes the proxy saw (not listings or property reads, which are HEADs)."""
    return [r for r in proxied.proxy.requests if r.method == "GET" and name in r.target.split("?")[0]]


def _cached_files(cache_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(cache_dir)) for p in cache_dir.rglob("*") if p.is_file()
                  and not p.name.endswith(".lock"))


def _wait_until(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# --- download and verify -----------------------------------------------------------------------------------
def test_a_shard_is_downloaded_once_in_chunks_verified_and_then_read_from_the_cache(
        proxied_blob: ProxiedBlob, tmp_path: Path) -> None:
    entry = _shards(proxied_blob.url, 1)[0]
    shards = open_shards(ShardIndex(proxied_blob.url, ()), cache_dir=str(tmp_path))
    assert isinstance(shards, ShardCache)
    proxied_blob.proxy.requests.clear()

    path = shards.local_path(entry)

    assert Path(path).read_bytes() == _shard_bytes(0) and path.startswith(str(tmp_path))
    assert len(_gets(proxied_blob, entry.path)) == -(-SHARD_BYTES // CHUNK)  # range requests, no whole body
    assert shards.local_path(entry) == path
    assert ShardCache(proxied_blob.url, str(tmp_path)).local_path(entry) == path  # another process's view
    assert len(_gets(proxied_blob, entry.path)) == -(-SHARD_BYTES // CHUNK)
    assert (shards.stats.downloads, shards.stats.downloaded_bytes, shards.stats.hits) == (1, SHARD_BYTES, 1)
    assert _cached_files(tmp_path) == [str(Path(path).relative_to(tmp_path))]


TRANSIENT_FAULTS: dict[str, dict[str, Any]] = {
    "503 twice": {"kind": "status", "status": 503, "times": 2},
    "429": {"kind": "status", "status": 429},
    "500 five times (outlasts the SDK's retries)": {"kind": "status", "status": 500, "times": 5},
    "connection reset": {"kind": "drop", "nth": 2},
    "body cut short": {"kind": "truncate", "keep_bytes": 100, "nth": 3},
    "body cut short five times": {"kind": "truncate", "keep_bytes": 100, "times": 5},
}


@pytest.mark.parametrize("fault", TRANSIENT_FAULTS)
def test_a_download_through_transient_faults_succeeds_verified(proxied_blob: ProxiedBlob, tmp_path: Path,
                                                               fault: str) -> None:
    entry = _shards(proxied_blob.url, 1)[0]
    injected = proxied_blob.proxy.inject(method="GET", path="shard-00000", **TRANSIENT_FAULTS[fault])

    path = ShardCache(proxied_blob.url, str(tmp_path)).local_path(entry)

    assert injected.applied >= 1
    assert Path(path).read_bytes() == _shard_bytes(0)
    assert _cached_files(tmp_path) == [str(Path(path).relative_to(tmp_path))]  # no temporary left


def test_a_fault_that_outlasts_the_retries_is_one_line_naming_the_shard_and_caches_nothing(
        proxied_blob: ProxiedBlob, tmp_path: Path) -> None:
    entry = _shards(proxied_blob.url, 1)[0]
    proxied_blob.proxy.inject("status", status=503, times=10_000, method="GET", path="shard-00000")

    with pytest.raises(StorageError) as error:
        ShardCache(proxied_blob.url, str(tmp_path)).local_path(entry)

    message = str(error.value)
    assert message.startswith(f"downloading {proxied_blob.url}/{entry.path} failed (after 4 attempts)")
    assert "HTTP 503" in message and "\n" not in message
    assert _cached_files(tmp_path) == []


# --- a shard that is not what the index says: one line, nothing cached -------------------------------------
def _remove(base: str, name: str) -> None:
    fs, root = fsspec.core.url_to_fs(base)
    fs.rm(f"{root}/{name}")


BROKEN = {
    "missing": (lambda base, e: _remove(base, e.path), r"shard {url} is missing"),
    "truncated in storage": (lambda base, e: _upload(base, e.path, _shard_bytes(0)[:1000]),
                             r"shard {url} has 1000 bytes, the index says 200000 \(truncated, or changed "
                             r"since indexing: run 'hvdazure data index' again\)$"),
    "changed since indexing": (lambda base, e: _upload(base, e.path, _shard_bytes(7)),
                               r"shard {url} changed since indexing \(run 'hvdazure data index' again\)$"),
}


@pytest.mark.parametrize("broken", BROKEN)
def test_a_shard_unlike_its_index_entry_is_one_line_naming_it_and_nothing_is_cached(
        blob_url: str, tmp_path: Path, broken: str) -> None:
    entry = _shards(blob_url, 1)[0]
    damage, message = BROKEN[broken]
    damage(blob_url, entry)
    cache = ShardCache(blob_url, str(tmp_path))
    expected = message.format(url=re.escape(f"{blob_url}/{entry.path}"))

    for _ in range(2):  # the same answer each time it is asked, and nothing left that a retry would take
        with pytest.raises(ShardError, match=expected) as error:
            cache.local_path(entry)
        assert "\n" not in str(error.value)
        assert _cached_files(tmp_path) == []


def test_a_shard_replaced_while_it_downloads_is_not_taken(proxied_blob: ProxiedBlob, tmp_path: Path) -> None:
    entry = _shards(proxied_blob.url, 1)[0]

    def replace(request: Request) -> None:  # before the second chunk is read: the same size, other bytes
        _upload(proxied_blob.url, entry.path, _shard_bytes(9))

    proxied_blob.proxy.inject("call", nth=2, method="GET", path="shard-00000", callback=replace)

    with pytest.raises(ShardError, match="changed"):
        ShardCache(proxied_blob.url, str(tmp_path)).local_path(entry)
    assert _cached_files(tmp_path) == []


# --- a download killed half-way ----------------------------------------------------------------------------
# The other processes here are forked (as DataLoader workers are): real processes with their own file
# descriptors and locks, without the seconds a fresh interpreter takes to import adlfs on a busy machine.
_FORK = multiprocessing.get_context("fork")


def _download_in_child(base: str, cache_dir: str, entry: ShardEntry) -> None:
    ShardCache(base, cache_dir).local_path(entry)


def test_a_download_killed_half_way_is_never_taken_and_its_temporary_is_cleaned(
        proxied_blob: ProxiedBlob, tmp_path: Path) -> None:
    entry = _shards(proxied_blob.url, 1)[0]
    child = _FORK.Process(target=_download_in_child, args=(proxied_blob.url, str(tmp_path), entry))

    def kill(request: Request) -> bool:  # on its third chunk: two are on disk under the temporary name
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        # Dead before its third chunk is answered. Wait on the sentinel, never join here: two threads
        # reaping one child race (the loser's waitpid gets ECHILD and its join reports exitcode None).
        multiprocessing.connection.wait([child.sentinel], 30)
        return False

    proxied_blob.proxy.inject("call", nth=3, method="GET", path="shard-00000", callback=kill)
    child.start()
    child.join(60)
    proxied_blob.proxy.clear()
    if child.is_alive():  # never left running: say how far it got
        child.kill()
        child.join()
        pytest.fail(f"the download was not killed: {len(_gets(proxied_blob, 'shard-00000'))} GETs seen")
    assert child.exitcode == -signal.SIGKILL
    left = _cached_files(tmp_path)
    assert len(left) == 1 and ".tmp-" in left[0]  # what the killed process wrote: 2 of 4 chunks

    cache = ShardCache(proxied_blob.url, str(tmp_path))
    path = cache.local_path(entry)

    assert Path(path).read_bytes() == _shard_bytes(0) and cache.stats.downloads == 1
    assert _cached_files(tmp_path) == [str(Path(path).relative_to(tmp_path))]


# --- one download per node ---------------------------------------------------------------------------------
def _read_all_in_child(base: str, cache_dir: str, entries: list[ShardEntry], go: Any, results: Any) -> None:
    """One rank: read-ahead on half the shards, then every shard, in an order of its own."""
    entries = random.Random(os.getpid()).sample(entries, len(entries))
    shards = ShardCache(base, cache_dir)
    go.wait()
    shards.prefetch(entries[: len(entries) // 2])
    paths = {entry.path: shards.local_path(entry) for entry in entries}
    shards.close()
    results.put((paths, shards.stats.downloads))


def test_several_processes_on_one_node_download_each_shard_once(proxied_blob: ProxiedBlob,
                                                                tmp_path: Path) -> None:
    entries = _shards(proxied_blob.url, 6)
    proxied_blob.proxy.latency = 0.01  # downloads overlap: the processes contend for the same shards
    proxied_blob.proxy.requests.clear()
    go, results = _FORK.Event(), _FORK.Queue()
    children = [_FORK.Process(target=_read_all_in_child,
                              args=(proxied_blob.url, str(tmp_path), entries, go, results)) for _ in range(4)]
    for child in children:
        child.start()
    go.set()  # all at once
    answers = [results.get(timeout=120) for _ in children]
    for child in children:
        child.join(30)
        assert child.exitcode == 0

    assert sum(downloads for _, downloads in answers) == len(entries)
    for entry in entries:
        assert len(_gets(proxied_blob, entry.path)) == -(-SHARD_BYTES // CHUNK), entry.path
        paths = {paths[entry.path] for paths, _ in answers}
        assert len(paths) == 1 and Path(paths.pop()).read_bytes() == _shard_bytes(int(entry.path[-9:-4]))
    assert len(_cached_files(tmp_path)) == len(entries)


# --- eviction and read-ahead -------------------------------------------------------------------------------
def test_the_least_recently_used_shards_are_evicted_to_keep_the_cache_under_its_limit(
        blob_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "_TOUCH_EVERY", 0.0)  # every use moves the LRU clock
    entries = _shards(blob_url, 6)
    cache = ShardCache(blob_url, str(tmp_path), limit_bytes=int(3.5 * SHARD_BYTES))

    def cached() -> list[int]:
        return [n for n, entry in enumerate(entries) if cache.is_cached(entry)]

    def use(*numbers: int) -> None:
        for number in numbers:
            cache.local_path(entries[number])
            time.sleep(0.01)  # distinct mtimes
            assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) <= 3.5 * SHARD_BYTES

    use(0, 1, 2, 0, 3, 4)
    assert cached() == [0, 3, 4]  # 1 and 2 were used least recently
    use(5)
    assert cached() == [3, 4, 5] and cache.stats.downloads == 6


def test_shards_in_the_read_ahead_queue_or_just_handed_out_are_never_evicted(
        blob_url: str, tmp_path: Path) -> None:
    entries = _shards(blob_url, 4)
    cache = ShardCache(blob_url, str(tmp_path), limit_bytes=SHARD_BYTES, prefetch_threads=1)
    for entry in entries[:3]:
        cache.local_path(entry)
    assert [cache.is_cached(e) for e in entries[:3]] == [False, True, True]  # the last two handed out stay

    with cache._lock:  # queued for read-ahead, as prefetch() leaves it while its thread is busy
        cache._queue.append(entries[1])
    cache.local_path(entries[3])
    assert [cache.is_cached(e) for e in entries] == [False, True, True, True]
    with cache._lock:
        cache._queue.clear()
    cache.local_path(entries[0])
    assert [cache.is_cached(e) for e in entries] == [True, False, False, True]


def test_prefetch_downloads_in_order_and_a_new_queue_replaces_the_old(proxied_blob: ProxiedBlob,
                                                                      tmp_path: Path) -> None:
    entries = _shards(proxied_blob.url, 6)
    cache = ShardCache(proxied_blob.url, str(tmp_path), prefetch_threads=1)
    proxied_blob.proxy.requests.clear()

    cache.prefetch([entries[2], entries[0], entries[1]])
    _wait_until(lambda: all(cache.is_cached(e) for e in entries[:3]))
    first_gets = [next(i for i, r in enumerate(proxied_blob.proxy.requests) if e.path in r.target)
                  for e in (entries[2], entries[0], entries[1])]
    assert first_gets == sorted(first_gets)

    proxied_blob.proxy.latency = 0.1  # the next download takes a while: the queue is replaced meanwhile
    cache.prefetch(entries[3:5])
    _wait_until(lambda: _gets(proxied_blob, entries[3].path))
    cache.prefetch([entries[5]])
    _wait_until(lambda: cache.is_cached(entries[5]))
    cache.close()
    assert not cache.is_cached(entries[4]) and not _gets(proxied_blob, entries[4].path)
    assert cache.stats.downloads == 5 and cache.stats.hits == 0  # read-ahead is no local_path


def test_a_cache_pickles_without_its_threads_and_the_copy_reads_through_the_same_files(
        blob_url: str, tmp_path: Path) -> None:
    entries = _shards(blob_url, 2)
    cache = ShardCache(blob_url, str(tmp_path))
    cache.prefetch(entries[:1])
    _wait_until(lambda: cache.is_cached(entries[0]))

    copy = pickle.loads(pickle.dumps(cache))  # what a DataLoader worker gets

    assert copy._threads == [] and copy.stats.downloads == 0
    assert copy.local_path(entries[0]) == cache.local_path(entries[0]) and copy.stats.downloads == 0
    assert Path(copy.local_path(entries[1])).read_bytes() == _shard_bytes(1) and copy.stats.downloads == 1
    cache.close()


# --- where the shards come from ----------------------------------------------------------------------------
def test_a_container_without_an_index_is_one_line_saying_what_to_run(blob_url: str) -> None:
    _shards(blob_url, 1)
    source = resolve_source(f"{blob_url}/train")

    assert source.needs_cache and source.index_url == f"{blob_url}/train/hvdazure-index.json"
    with pytest.raises(MissingIndexError) as error:
        source.load_index()
    assert str(error.value) == (f"no index at {blob_url}/train/hvdazure-index.json: run 'hvdazure data index "
                                f"{blob_url}/train' first")


def test_an_az_url_and_a_glob_of_blobs_resolve_to_the_index_in_its_directory(blob_url: str) -> None:
    container = blob_url.removeprefix("abfs://")
    fs, _ = fsspec.core.url_to_fs(blob_url)
    for number in range(3):
        fs.pipe_file(f"{container}/train/shard-{number}.tar", _tar(2))
    build_index(f"{blob_url}/train", progress=False)

    source = resolve_source(f"az://{container}/train/shard-[02].tar")

    assert (source.index_url, source.base, source.pattern) == (
        f"az://{container}/train/hvdazure-index.json", f"az://{container}/train", "shard-[02].tar")
    assert [entry.path for entry in source.load_index().shards] == ["shard-0.tar", "shard-2.tar"]


def _tar(samples: int) -> bytes:
    """A WebDataset tar of `samples` samples (key.txt members)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key in range(samples):
            data = f"sample {key}".encode()
            member = tarfile.TarInfo(f"{key:04d}.txt")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
    return buffer.getvalue()


def test_an_index_built_by_hvdazure_data_index_is_read_through_the_cache(blob_url: str,
                                                                         tmp_path: Path) -> None:
    fs, root = fsspec.core.url_to_fs(blob_url)
    for number in range(2):
        fs.pipe_file(f"{root}/train/shard-{number}.tar", _tar(3))
    build_index(f"{blob_url}/train", progress=False)

    index = resolve_source(f"{blob_url}/train/shard-1*").load_index()
    shards = open_shards(index, cache_dir=str(tmp_path))

    assert [entry.path for entry in index.shards] == ["shard-1.tar"]
    assert Path(shards.local_path(index.shards[0])).read_bytes() == _tar(3)
