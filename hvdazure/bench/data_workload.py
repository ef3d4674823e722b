"""What each rank of `hvdazure bench data` runs: reading a sharded dataset along this rank's plan through
the PyTorch binding's loader (hvdazure.torch.data.train_loader, what TorchTrainer uses), against a raw
read of the same shard files with the same concurrency, in the same run.

Framework: torch and horovod.torch (ranks, the loader); imported here only, never by the launching
process (data.py).
"""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

CHUNK = 8 << 20  # bytes per read() of the raw read
PREFETCH_THREADS = 4  # the cache's download threads (hvdazure.data.cache default): the raw read's concurrency


def schedule(quick: bool) -> dict[str, Any]:
    """The dataset and the run: shards x samples of `sample_kb` KB, batch per rank, repeats, probes."""
    if quick:
        return {"shards": 8, "samples_per_shard": 16, "sample_kb": 16, "batch_size": 8, "repeats": 1,
                "memory_rounds": 1, "memory_scales": [1, 4], "num_workers": 2}
    return {"shards": 32, "samples_per_shard": 64, "sample_kb": 64, "batch_size": 16, "repeats": 5,
            "memory_rounds": 3, "memory_scales": [1, 4], "num_workers": 2}


def _samples(p: dict[str, Any], scale: int = 1) -> Iterator[dict[str, Any]]:
    """Random bytes as images (incompressible, like JPEG) and a label per sample, one at a time (writing
    a dataset holds one sample in memory, whatever its size)."""
    rng = np.random.default_rng(0)
    for _ in range(p["shards"] * p["samples_per_shard"] * scale):
        yield {"image": rng.integers(0, 256, size=p["sample_kb"] * 1024, dtype=np.uint8),
               "label": int(rng.integers(0, 10))}


def _write(p: dict[str, Any], root: str, scale: int = 1) -> str:
    from hvdazure.data import write_shards

    target = f"{root.rstrip('/')}/dataset"
    write_shards(_samples(p, scale), target, "tar", samples_per_shard=p["samples_per_shard"], progress=False)
    return target


def _drop_page_cache(paths: list[str]) -> None:
    """Evict these files from the page cache (no root needed), so a read of them goes to the disk."""
    for path in paths:
        with open(path, "rb") as f:
            os.fsync(f.fileno())  # dirty pages are not dropped: write them out first
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def raw_read(opener: Callable[[str], Any], paths: list[str]) -> tuple[float, int]:
    """Seconds and bytes to read `paths` whole, in order, PREFETCH_THREADS at a time."""
    def read(path: str) -> int:
        total = 0
        with opener(path) as f:
            while chunk := f.read(CHUNK):
                total += len(chunk)
        return total

    start = time.perf_counter()
    with ThreadPoolExecutor(PREFETCH_THREADS) as pool:
        total = sum(pool.map(read, paths))
    return time.perf_counter() - start, total


def _batches(dataset: Any, plan: Any, start_sample: int, num_workers: int) -> Iterator[Any]:
    from hvdazure.torch.data import train_loader

    return iter(train_loader(dataset, plan, 0, start_sample, None, num_workers, pin_memory=False))


def timed_epoch(dataset: Any, plan: Any, num_workers: int, compute_s: float = 0.0,
                start_sample: int = 0) -> dict[str, Any]:
    """This rank's epoch through the loader: per micro-batch the wait for it, then `compute_s` of sleep
    (a step whose compute runs elsewhere, as on a GPU); time to the first batch included separately."""
    start = time.perf_counter()
    batches = _batches(dataset, plan, start_sample, num_workers)
    waits, samples = [], 0
    first = None
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            break
        waits.append(time.perf_counter() - t0)
        if first is None:
            first = time.perf_counter() - start
        samples += len(batch["label"])
        if compute_s:
            time.sleep(compute_s)
    total = time.perf_counter() - start
    return {"seconds": total, "samples": samples, "first_batch_s": first or 0.0, "waits_s": waits}


def _rank_paths(dataset: Any, plan: Any) -> list[Any]:
    """The shards this rank reads in epoch 0, in order of first use."""
    mine = np.fromiter((i for step in plan.epoch(0) for mb in step for i in mb.indices), dtype=np.int64)
    shards, _ = dataset.sample_order.locate(mine)
    _, first = np.unique(shards, return_index=True)
    return [dataset.index.shards[k] for k in shards[np.sort(first)].tolist()]


def _share_cores(local_ranks: int) -> None:
    """Torch threads per rank as TorchTrainer sets them: the node's cores shared by its ranks (collate's
    torch.stack with more threads than cores is 10x slower on a loaded machine)."""
    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // local_ranks))


def measure_ranks(url: str | None, p: dict[str, Any],
                  progress: Callable[[str], None]) -> dict[str, Any] | None:
    """Every rank: cold and warm epochs, the raw reads, the data wait with a fixed compute, time to the
    first batch of a resume, shards touched; rank 0 returns every rank's figures."""
    import fsspec
    import horovod.torch as hvd

    from hvdazure.core.sample_plan import SamplePlan
    from hvdazure.data import ShardedDataset

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    _share_cores(hvd.local_size())
    local = url is None
    scratch = hvd.broadcast_object(tempfile.mkdtemp(prefix="hvdazure-bench-data-") if rank == 0 else None,
                                   root_rank=0, name="scratch")
    root = f"{scratch}/source" if url is None else f"{url.rstrip('/')}/hvdazure-bench-{uuid.uuid4().hex[:8]}"
    root = hvd.broadcast_object(root if rank == 0 else None, root_rank=0, name="root")
    cache_dir = f"{scratch}/cache"  # one node: every rank shares it, as ranks of a node do
    try:
        if rank == 0:
            progress(f"data: writing {p['shards']} shards to {root}")
            _write(p, root)
        hvd.broadcast_object(0, 0, name="written")  # a barrier: the shards and the index are there
        source = f"{root}/dataset"

        def dataset() -> Any:
            return ShardedDataset(source, cache_dir=cache_dir)

        probe = dataset()
        plan = SamplePlan(len(probe), p["batch_size"], size, rank, seed=0, order=probe.sample_order)
        entries = _rank_paths(probe, plan)
        fs, _ = fsspec.core.url_to_fs(source)
        base = probe.index.base.rstrip("/")
        source_paths = [f"{base}/{e.path}" for e in entries]
        touched = len(entries)
        figures: dict[str, list[float]] = {k: [] for k in (
            "raw_source_s", "cold_s", "warm_s", "raw_local_s", "wait_fraction", "resume_first_batch_s",
            "cold_first_batch_s")}
        fetched: list[int] = []
        read_bytes = sum(e.bytes for e in entries)

        def clear_cache() -> None:
            hvd.broadcast_object(0, 0, name="before-clear")
            if rank == 0:
                shutil.rmtree(cache_dir, ignore_errors=True)
            hvd.broadcast_object(0, 0, name="cleared")
            if local:
                _drop_page_cache([f"{base}/{e.path}" for e in probe.index.shards])

        for repeat in range(p["repeats"]):
            # raw read of this rank's shards from the source
            clear_cache()
            seconds, _ = raw_read(lambda path: fs.open(path, "rb", block_size=CHUNK), source_paths)
            figures["raw_source_s"].append(seconds)
            # cold epoch: downloads (remote) or disk reads (local), no compute
            clear_cache()
            cold_set = dataset()
            cold = timed_epoch(cold_set, plan, 0)
            figures["cold_s"].append(cold["seconds"])
            figures["cold_first_batch_s"].append(cold["first_batch_s"])
            fetched.append(cold_set.cache_stats.downloaded_bytes if cold_set.cache_stats else 0)
            # warm epoch: the same shards again, from the cache (or the page cache)
            warm = timed_epoch(cold_set, plan, 0)
            figures["warm_s"].append(warm["seconds"])
            local_paths = [cold_set.local_path(e) for e in entries]
            seconds, _ = raw_read(lambda path: open(path, "rb"), local_paths)  # noqa: SIM115
            figures["raw_local_s"].append(seconds)
            cold_set.close()
            # data wait: a cold cache, the loader's workers, a step's compute twice the cold read per batch
            per_batch = cold["seconds"] / max(1, len(cold["waits_s"]))
            compute = max(0.005, 2 * per_batch)
            clear_cache()
            waited = timed_epoch(dataset(), plan, p["num_workers"], compute_s=compute)
            waits = waited["waits_s"][p["num_workers"]:]  # once prefetch runs: each worker's first batch out
            figures["wait_fraction"].append(sum(waits) / max(1e-9, sum(waits) + compute * len(waits)))
            # a resume half way through the epoch on a cold cache: time to its first batch
            clear_cache()
            resumed = timed_epoch(dataset(), plan, 0, start_sample=len(probe) // 2)
            figures["resume_first_batch_s"].append(resumed["first_batch_s"])
            if rank == 0:
                progress(f"data: repeat {repeat + 1}/{p['repeats']}")
        mine = {"rank": rank, "shards_touched": touched, "read_bytes": read_bytes, "figures": figures,
                "fetched_bytes": fetched, "samples": cold["samples"], "compute_s": compute,
                "micro_batches": len(waited["waits_s"])}
        every = hvd.allgather_object(mine, name="figures")  # also the barrier before rank 0 cleans up
        if rank != 0:
            return None
        return {"url": url, "world_size": size, "num_shards": len(probe.index.shards),
                "dataset_bytes": sum(e.bytes for e in probe.index.shards), "num_samples": len(probe),
                "ranks": every}
    finally:  # no collective here: a rank that failed has left the job, the launcher stops the others
        if rank == 0:
            shutil.rmtree(scratch, ignore_errors=True)
            if not local:
                fs, path = fsspec.core.url_to_fs(root)
                if fs.exists(path):
                    fs.rm(path, recursive=True)


def write_dataset(p: dict[str, Any], folder: str, scale: int) -> dict[str, Any]:
    """A local dataset `scale` times the size (more shards of the same size) in `folder`."""
    return {"source": _write(p, folder, scale)}


def measure_memory(p: dict[str, Any], source: str) -> dict[str, Any]:
    """A fresh process reads one epoch of the local dataset at `source` through the loader: its peak RSS
    in MB (what the process holds at most: the index, the order, open readers, a batch)."""
    from hvdazure.core.sample_plan import SamplePlan
    from hvdazure.data import ShardedDataset

    _share_cores(1)
    dataset = ShardedDataset(source, cache=False)
    plan = SamplePlan(len(dataset), p["batch_size"], 1, 0, seed=0, order=dataset.sample_order)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    epoch = timed_epoch(dataset, plan, 0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"num_samples": len(dataset), "peak_rss_mb": peak, "rss_before_epoch_mb": before,
            "dataset_mb": sum(e.bytes for e in dataset.index.shards) / 2**20, "epoch_s": epoch["seconds"]}
