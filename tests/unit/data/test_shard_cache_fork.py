"""A ShardCache across a fork: a DataLoader worker forked while a read-ahead thread of its rank downloads a
shard (holding that shard's lock file) reads the shard once the download ends. The lock is an flock, held
by the open file and by every copy of it: the fork copies it into the worker, and a copy the worker kept
would hold the lock for the worker's life, where the worker itself, or any process of the node, would wait
for that shard forever (issue 46)."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from shard_files import indexed_shard

from hvdazure.data.cache import ShardCache
from hvdazure.data.index import ShardEntry

_FORK = multiprocessing.get_context("fork")  # as torch's DataLoader starts its workers on Linux


def _read_in_worker(cache: ShardCache, entry: ShardEntry, results: Any) -> None:
    results.put(Path(cache.local_path(entry)).read_bytes())


def test_a_worker_forked_during_a_read_ahead_download_reads_that_shard_when_it_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = indexed_shard(tmp_path / "data", "shard-00000.tar", b"x" * 1000)
    cache = ShardCache(str(tmp_path / "data"), str(tmp_path / "cache"), prefetch_threads=1)
    downloading, download_may_end, rank = threading.Event(), threading.Event(), os.getpid()
    download = ShardCache._download

    def slow_download(self: ShardCache, shard: ShardEntry, temporary: str) -> int:
        if os.getpid() == rank:  # the rank's read-ahead thread, holding the shard's lock meanwhile
            downloading.set()
            download_may_end.wait()
        return download(self, shard, temporary)

    monkeypatch.setattr(ShardCache, "_download", slow_download)
    cache.prefetch([entry])
    assert downloading.wait(10)
    results = _FORK.Queue()
    worker = _FORK.Process(target=_read_in_worker, args=(cache, entry, results))
    worker.start()  # forked while the read-ahead thread holds the lock
    download_may_end.set()
    cache.close()  # the download has ended: the rank let go of the lock
    try:
        assert results.get(timeout=20) == b"x" * 1000
    except Exception:
        raise AssertionError("the worker waits forever for the shard's lock its rank let go of") from None
    finally:
        worker.kill()
        worker.join()
