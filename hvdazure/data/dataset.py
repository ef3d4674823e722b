"""ShardedDataset: a dataset bigger than memory, stored in shards, that either trainer reads exactly.

What the trainers get from it: its length, its order (`sample_order`, data/shard_order.py's ShardOrder:
each rank reads few shards, the same samples per step at any world size, each sample once per epoch) and
its data fingerprint (the index's, recorded in checkpoints: a resume on changed data is refused). Samples
are numbered shard by shard in index order; `__getitem__` / `__getitems__` read them by number.

Reading: the source is resolved to an index (source.py), the shards are opened through the node's cache
(cache.py: remote storage and FUSE mounts copied whole, once per node; local disks read in place), and a
reader stays open per shard, the `readers_kept(order)` most recently used per process. `read_ahead` hands the
cache the shards of this rank's next samples, so that they are fetched while it trains on the current ones
(the bindings call it every step with the next few steps' samples: `read_ahead_steps`).

Processes: the dataset pickles without its readers and its cache (DataLoader workers with a spawn start),
and a forked worker, which inherits them, notices the new process and opens its own: no thread, lock or
file position crosses a fork. Memory per process: the index's offsets (8 bytes a sample) and the epoch
order (8 bytes a sample), never the samples.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import groupby
from typing import TYPE_CHECKING, Any

import numpy as np

from hvdazure.data.shard_order import DEFAULT_LANES, ShardOrder

if TYPE_CHECKING:
    from hvdazure.core.sample_plan import MicroBatch
    from hvdazure.core.step_batches import StepCursor
    from hvdazure.data.cache import CacheStats, Shards
    from hvdazure.data.formats import Columns, ShardReader
    from hvdazure.data.index import ShardEntry, ShardIndex

OPEN_READERS: int | None = None  # shard readers kept open per process (least recently used closed first);
# None: readers_kept(order), the shards the order reads at once
MIN_OPEN_READERS = 8
READ_AHEAD_STEPS = 4  # optimizer steps of this rank's plan whose shards the bindings hand the cache


class ShardedDataset:
    """Samples of a sharded dataset (WebDataset tar, TFRecord or Parquet shards with an hvdazure index).

    `source`: a local directory, glob or index file, an abfs:// / az:// URL, or an Azure ML input path.
    `decode(raw)` turns a raw sample into what a batch is made of (default: the format's, see
    hvdazure.data.formats); `batch_decode(raws)`, if given, turns a micro-batch's raw samples into the
    batch itself (e.g. `lambda records: tf.io.parse_example(records, spec)`), and `decode` is not used.
    `lanes`, `window`: the order's parameters (data/shard_order.py); a checkpoint records them.
    `cache`, `cache_dir`, `cache_limit`, `storage_options`: how shards are fetched (hvdazure.data.cache).
    `prefetch_shards`: at most this many shards downloaded ahead of this rank's reading."""

    _shards: Shards | None  # this process's cache (or local files), opened on first use
    _readers: OrderedDict[int, ShardReader]  # this process's open readers, least recently used first
    _pid: int | None  # the process they belong to
    _lock: threading.Lock  # one reader at a time (a tf.data thread may read while the main thread does)

    def __init__(self, source: str, decode: Callable[[Any], Any] | None = None, *,
                 batch_decode: Callable[[list[Any]], Any] | None = None,
                 lanes: int = DEFAULT_LANES, window: int | None = None,
                 cache: str | bool = "auto", cache_dir: str | None = None,
                 cache_limit: str | int | None = None, prefetch_shards: int = 4,
                 storage_options: dict[str, Any] | None = None) -> None:
        from hvdazure.data.source import resolve_source  # here: importing hvdazure.data stays light

        if prefetch_shards < 0:
            raise ValueError(f"prefetch_shards must be 0 or more, got {prefetch_shards}")
        self.source, self.decode, self.batch_decode = source, decode, batch_decode
        self.cache, self.cache_dir, self.cache_limit = cache, cache_dir, cache_limit
        self.prefetch_shards, self.storage_options = prefetch_shards, dict(storage_options or {})
        self.index: ShardIndex = resolve_source(source, self.storage_options).load_index(self.storage_options)
        self._order = ShardOrder(tuple(entry.num_samples for entry in self.index.shards), lanes, window)
        self._fingerprint: str = self.index.fingerprint()
        self._decoders: dict[str, Callable[[Any], Any]] = {}
        self._reset_process_state()

    # --- what the trainers ask -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._order.num_samples

    @property
    def sample_order(self) -> ShardOrder:
        """The epoch order of this dataset's samples, for the trainers' SamplePlan."""
        return self._order

    @property
    def data_fingerprint(self) -> str:
        """The index's fingerprint: shards' paths, formats, sample counts, sizes and versions."""
        return self._fingerprint

    def __getitem__(self, i: int) -> Any:
        """Global sample `i`, decoded."""
        ((shard, position),) = self._located([i])
        self._shards_here()  # first: a forked child replaces its parent's lock, which may be held
        with self._lock:
            raw = self._reader(shard).read(position)
        return self._decode(shard, raw)

    def __getitems__(self, indices: Sequence[int]) -> Any:
        """The samples at `indices`, in that order: a list of decoded samples, or batch_decode's batch.
        Reads go shard by shard in file order, a shard's samples in one call (formats: `read_many`)."""
        located = self._located(indices)
        raws = self._read(located)
        if self.batch_decode is not None:
            return self.batch_decode(raws)
        return [self._decode(shard, raw) for (shard, _), raw in zip(located, raws, strict=True)]

    def read_columns(self, indices: Sequence[int]) -> Columns | None:
        """The samples at `indices`, in that order, decoded by their format's default decode as columns
        (formats/__init__.py: a field of arrays of one dtype and shape stacked into one array, bit for bit
        what stacking `__getitems__`' samples gives; any other field the list of its values). None where
        the dataset has its own decode or batch_decode, or the samples are not dicts of the same fields:
        read those with `__getitems__`. This is the bindings' fast path for the default decode."""
        if self.decode is not None or self.batch_decode is not None or not len(indices):
            return None
        located = self._located(indices)
        formats = {self.index.shards[shard].format for shard, _ in located}
        if len(formats) > 1:
            from hvdazure.data.formats import columns_of

            return columns_of(self.__getitems__(indices))
        from hvdazure.data.formats import default_decode_columns

        return default_decode_columns(formats.pop())(self._read(located, views=True))

    def read_ahead(self, samples: Iterable[int] | np.ndarray) -> None:
        """The samples this process's rank reads next, in order: the cache fetches their shards in the
        background, in order of first use, at most `prefetch_shards` not yet cached (replacing what it
        was asked for before)."""
        samples = np.fromiter(samples, dtype=np.int64) if not isinstance(samples, np.ndarray) else samples
        if not samples.size or not self.prefetch_shards:
            return
        shards, _ = self._order.locate(samples)
        _, first = np.unique(shards, return_index=True)
        upcoming = [self.index.shards[k] for k in shards[np.sort(first)].tolist()]
        store = self._shards_here()
        is_cached = getattr(store, "is_cached", None)
        if is_cached is not None:
            upcoming = [entry for entry in upcoming if not is_cached(entry)]
        store.prefetch(upcoming[: self.prefetch_shards])

    def close(self) -> None:
        """Close this process's readers and stop its cache's read-ahead."""
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        if self._shards is not None:
            self._shards.close()
            self._shards = None

    @property
    def cache_stats(self) -> CacheStats | None:
        """What this process's shard cache downloaded and found there; None where shards are read in place."""
        stats: CacheStats | None = getattr(self._shards_here(), "stats", None)
        return stats

    def local_path(self, entry: ShardEntry) -> str:
        """The local file of shard `entry`: fetched into the node's cache first where shards are remote."""
        return self._shards_here().local_path(entry)

    # --- pickling (DataLoader workers) --------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_shards=None, _readers=None, _pid=None, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_process_state()

    # --- reading ---------------------------------------------------------------------------------------
    def _reset_process_state(self) -> None:
        """This process's cache and readers: none yet (opened on first use)."""
        self._shards = None
        self._readers = OrderedDict()
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def _shards_here(self) -> Shards:
        """This process's view of the shards; a forked child drops its parent's (threads, locks and file
        positions are the parent's) without closing them, and opens its own."""
        if self._pid != os.getpid():
            self._reset_process_state()
        if self._shards is None:
            from hvdazure.data.cache import open_shards

            self._shards = open_shards(self.index, self.cache, self.cache_dir, self.cache_limit,
                                       self.storage_options)
        return self._shards

    def _located(self, indices: Sequence[int]) -> list[tuple[int, int]]:
        shards, offsets = self._order.locate(np.asarray(indices, dtype=np.int64))
        return list(zip(shards.tolist(), offsets.tolist(), strict=True))

    def _read(self, located: list[tuple[int, int]], views: bool = False) -> list[Any]:
        """The raw samples at (shard, position) pairs, in the order given; read in (shard, position)
        order, each shard's in one `read_many` (`views`: byte strings may be memoryviews)."""
        from hvdazure.data.formats import read_batch

        raws: list[Any] = [None] * len(located)
        self._shards_here()  # first: a forked child replaces its parent's lock, which may be held
        with self._lock:
            wanted = sorted(range(len(located)), key=located.__getitem__)
            groups = [list(group) for _, group in groupby(wanted, key=lambda at: located[at][0])]
            by_format: dict[str, list[list[int]]] = {}
            for ats in groups:
                by_format.setdefault(self.index.shards[located[ats[0]][0]].format, []).append(ats)
            opens = any(located[ats[0]][0] not in self._readers for ats in groups)
            for format, shard_groups in by_format.items():
                requests: list[tuple[ShardReader, Sequence[int]]] = [
                    (self._reader(located[ats[0]][0], close_old=False), [located[at][1] for at in ats])
                    for ats in shard_groups]
                for ats, got in zip(shard_groups, read_batch(format, requests, views), strict=True):
                    for at, raw in zip(ats, got, strict=True):
                        raws[at] = raw
            if opens:
                self._close_old_readers()  # after the batch: its readers stay open while it is read
        return raws

    def _reader(self, shard: int, close_old: bool = True) -> ShardReader:
        """Shard `shard`'s open reader (opened if need be), now the most recently used; `close_old`: close
        the least recently used ones beyond readers_kept (else the caller does, `_close_old_readers`)."""
        store = self._shards_here()
        reader = self._readers.get(shard)
        if reader is not None:
            self._readers.move_to_end(shard)
            return reader
        from hvdazure.data.formats import open_shard

        entry = self.index.shards[shard]
        reader = open_shard(store.local_path(entry), entry)
        self._readers[shard] = reader
        if close_old:
            self._close_old_readers()
        return reader

    def _close_old_readers(self) -> None:
        while len(self._readers) > readers_kept(self._order):
            self._readers.popitem(last=False)[1].close()

    def _decode(self, shard: int, raw: Any) -> Any:
        if self.decode is not None:
            return self.decode(raw)
        format = self.index.shards[shard].format
        if format not in self._decoders:
            from hvdazure.data.formats import default_decode

            self._decoders[format] = default_decode(format)
        return self._decoders[format](raw)


def readers_kept(order: ShardOrder) -> int:
    """Shard readers a process keeps open: the shards `order` has at hand at once (about lanes x (window
    / mean shard size + 2) at world size 1, see data/shard_order.py), at least MIN_OPEN_READERS. Fewer makes
    every read reopen its shard (and, for Parquet, decode its row group again). OPEN_READERS, if set, wins."""
    if OPEN_READERS is not None:
        return OPEN_READERS
    filled = sum(1 for size in order.shard_sizes if size) or 1
    mean_shard = max(1, order.num_samples // filled)
    return max(MIN_OPEN_READERS, order.lanes * (-(-order.window_samples // mean_shard) + 2))


def read_ahead_steps(dataset: ShardedDataset, steps: StepCursor,
                     ahead: int = READ_AHEAD_STEPS) -> Iterator[list[MicroBatch]]:
    """`steps` (a cursor over the core's walk of this rank's plan, core/step_batches.py), handing the
    dataset the samples of each step and of the `ahead` coming ones as it starts, so that their shards are
    fetched while it trains."""
    for step in steps:
        window = [step, *steps.coming(ahead)]
        dataset.read_ahead(np.fromiter((i for step in window for cell in step for i in cell.indices),
                                       dtype=np.int64))
        yield step
