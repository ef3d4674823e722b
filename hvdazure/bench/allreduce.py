"""Collective bandwidth: hvdazure's gradient path against raw Horovod, torch.distributed and mpi4py.

    hvdazure bench allreduce -np 2 [--mpi] [--op allreduce|broadcast|allgather] [--quick] [--json OUT.json]

On the same ranks in one job, for message sizes 4 KB .. 256 MB (--quick: up to 16 MB), the peers take turns
(interleaved per size and per repeat, their order rotated) so machine noise hits them alike:
- hvdazure: the path the trainer's gradients take on this device (torch/gradients.py): on CPUs its grouped
  allreduce after backward, on GPUs `hvd.DistributedOptimizer(...).synchronize()` (Horovod's
  allreduce_async_ on the gradient), with the trainer's compression and op, Average; for broadcast, the
  parameter broadcast the trainer starts with (`hvd.broadcast_parameters`); for allgather, the trainer's
  Collectives.allgather_bytes (metrics and state). `hvdazure fp16`: the same with fp16 compression (the
  figures count the uncompressed fp32 bytes: the bandwidth the user sees).
- horovod: `horovod.torch`'s allreduce_ / broadcast_ / allgather on the same tensor.
- torch.distributed gloo (and nccl with CUDA), started inside the same ranks (env:// on 127.0.0.1, a free
  port rank 0 picks and broadcasts): one node only.
- mpi4py: Allreduce / Bcast / Allgather on NumPy buffers; only under --mpi (mpi4py is built against
  Horovod's MPI; under Gloo the ranks are no MPI job).
A peer that cannot run is reported as skipped with the reason. Reported per size and peer: the median time
of one collective over the repeats (each repeat a loop of iterations, the slowest rank's time), algorithm
bandwidth (bytes / time; for allgather the gathered bytes, as nccl-tests counts them, while sizes are per
rank) and bus bandwidth (nccl-tests: x 2(n-1)/n for allreduce, (n-1)/n for allgather, 1 for broadcast).
Target: hvdazure >= 0.98 of raw Horovod's bandwidth at >= 1 MB.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hvdazure.bench import stats
from hvdazure.bench.benchmark import BenchError, Options, RankBenchmark, Result, progress
from hvdazure.figures import pyplot, save_figure

KB, MB = 1024, 1024 * 1024
TARGET = 0.98  # hvdazure's bandwidth as a share of raw Horovod's, at >= 1 MB
ONE_MB = MB


def message_sizes(quick: bool) -> list[int]:
    """4 KB .. 256 MB in steps of 4x (--quick: up to 16 MB)."""
    largest = 16 * MB if quick else 256 * MB
    sizes, size = [], 4 * KB
    while size <= largest:
        sizes.append(size)
        size *= 4
    return sizes


def iterations(nbytes: int, quick: bool) -> int:
    """Collectives per timed loop: about 64 MB moved per loop, 2 to 50 of them (--quick: 1 to 4)."""
    if quick:
        return max(1, min(4, 4 * MB // nbytes))
    return max(2, min(50, 64 * MB // nbytes))


class Peer:
    """One way of running the collective: `setup(tensor)` returns the function that runs it once on that
    tensor, or the peer is skipped (`skipped` holds why)."""

    def __init__(self, name: str, setup: Callable[[Any], Callable[[], object]] | None = None,
                 skipped: str | None = None) -> None:
        self.name, self.setup, self.skipped = name, setup, skipped


def _hvdazure_peers(hvd: Any, torch: Any, op: str) -> list[Peer]:
    from hvdazure.torch.collectives import TorchCollectives
    from hvdazure.torch.gradients import COMPRESSION, GradientsAfterBackward, overlaps_backward

    def gradient_path(compression: str, label: str) -> Callable[[Any], Callable[[], None]]:
        def setup(tensor: Any) -> Callable[[], None]:
            param = torch.nn.Parameter(torch.zeros_like(tensor))
            param.grad = tensor.clone()
            if not overlaps_backward("auto", "average", tensor.device):  # the trainer's choice on this device
                return GradientsAfterBackward([param], "average", compression, 1.0)
            optimizer = hvd.DistributedOptimizer(
                torch.optim.SGD([param], lr=0.0), named_parameters=[(f"{label}.{tensor.numel()}", param)],
                compression=COMPRESSION[compression], op=hvd.Average)
            return optimizer.synchronize
        return setup

    if op == "allreduce":
        return [Peer("hvdazure", gradient_path("none", "bench.grad")),
                Peer("hvdazure fp16", gradient_path("fp16", "bench.grad16"))]
    if op == "broadcast":
        return [Peer("hvdazure", lambda t: lambda: hvd.broadcast_parameters({"p": t}, root_rank=0))]
    comm = TorchCollectives(rank_device(torch, hvd))

    def gather_bytes(tensor: Any) -> Callable[[], object]:
        data = tensor.cpu().numpy().tobytes()
        return lambda: comm.allgather_bytes(data)
    return [Peer("hvdazure", gather_bytes)]


def rank_device(torch: Any, hvd: Any) -> Any:
    """This rank's GPU (Horovod's local rank), or the CPU without CUDA."""
    return torch.device("cuda", hvd.local_rank()) if torch.cuda.is_available() else torch.device("cpu")


def _horovod_peer(hvd: Any, op: str) -> Peer:
    def setup(tensor: Any) -> Callable[[], None]:
        name = f"bench.raw.{tensor.numel()}"
        if op == "allreduce":
            return lambda: hvd.allreduce_(tensor, op=hvd.Average, name=name)
        if op == "broadcast":
            return lambda: hvd.broadcast_(tensor, 0, name=name)
        return lambda: hvd.allgather(tensor, name=name)
    return Peer("horovod", setup)


def _torch_distributed_peers(hvd: Any, torch: Any, op: str) -> list[Peer]:
    import torch.distributed as dist

    backends = ["gloo"] + (["nccl"] if torch.cuda.is_available() else [])
    if hvd.size() != hvd.local_size():
        reason = "one node only here (rendezvous on 127.0.0.1)"
        return [Peer(f"torch.distributed {b}", skipped=reason) for b in backends]
    port = None
    if hvd.rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, root_rank=0, name="bench.port")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        dist.init_process_group("gloo", init_method="env://", rank=hvd.rank(), world_size=hvd.size())
    except Exception as exc:  # reported, never faked
        return [Peer(f"torch.distributed {b}", skipped=f"init failed: {exc}") for b in backends]
    peers = []
    for backend in backends:
        try:
            group = None if backend == "gloo" else dist.new_group(backend=backend)
        except Exception as exc:
            peers.append(Peer(f"torch.distributed {backend}", skipped=f"new_group failed: {exc}"))
            continue

        def setup(tensor: Any, group: Any = group) -> Callable[[], None]:
            if op == "allreduce":
                return lambda: dist.all_reduce(tensor, group=group)
            if op == "broadcast":
                return lambda: dist.broadcast(tensor, 0, group=group)
            out = [torch.empty_like(tensor) for _ in range(hvd.size())]
            return lambda: dist.all_gather(out, tensor, group=group)
        peers.append(Peer(f"torch.distributed {backend}", setup))
    return peers


def _mpi4py_peer(hvd: Any, op: str, controller: str) -> Peer:
    if controller != "mpi":
        return Peer("mpi4py", skipped="needs --mpi: under Gloo the ranks are not an MPI job")
    try:
        import numpy as np
        from mpi4py import MPI
    except ImportError as exc:
        return Peer("mpi4py", skipped=f"not importable: {exc}")
    comm = MPI.COMM_WORLD

    def setup(tensor: Any) -> Callable[[], None]:
        buffer = np.zeros(tensor.numel(), dtype=np.float32)
        if op == "allreduce":
            return lambda: comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
        if op == "broadcast":
            return lambda: comm.Bcast(buffer, root=0)
        out = np.empty(buffer.size * comm.Get_size(), dtype=np.float32)
        return lambda: comm.Allgather(buffer, out)
    return Peer("mpi4py", setup)


def _row(peer: str, nbytes: int, iters: int, times: list[float], world_size: int, op: str) -> dict:
    median = sorted(times)[len(times) // 2] if len(times) % 2 else sum(sorted(times)[len(times) // 2 - 1:
                                                                                   len(times) // 2 + 1]) / 2
    moved = nbytes * world_size if op == "allgather" else nbytes  # nccl-tests: allgather's output size
    algbw = moved / median / 1e9
    return {"peer": peer, "bytes": nbytes, "iterations": iters, "times_s": times, "latency_us": median * 1e6,
            "algbw_GBps": algbw, "busbw_GBps": stats.bus_bandwidth(algbw, world_size, op)}


def summarize(rows: list[dict]) -> dict:
    """Bandwidth shares at >= 1 MB, from the paired repeats (peers interleaved within each repeat):
    hvdazure / horovod (the target) and horovod / each other peer."""
    by = {(r["peer"], r["bytes"]): r for r in rows}
    peers = sorted({r["peer"] for r in rows})
    sizes = sorted({r["bytes"] for r in rows if r["bytes"] >= ONE_MB})
    comparisons: dict[str, dict[str, Any]] = {}
    for a, b in [("hvdazure", "horovod"), ("hvdazure fp16", "horovod"),
                 *(("horovod", p) for p in peers if p not in ("horovod", "hvdazure", "hvdazure fp16"))]:
        if a not in peers or b not in peers or not sizes:
            continue
        # bandwidth of a over b = time of b over time of a, repeat by repeat
        ratios = [tb / ta for s in sizes
                  for ta, tb in zip(by[(a, s)]["times_s"], by[(b, s)]["times_s"], strict=True)]
        low, high = stats.bootstrap_interval(ratios)
        ordered = sorted(ratios)
        comparisons[f"{a} / {b}"] = {"median": float(ordered[len(ordered) // 2]), "ci95": [low, high],
                                     "pairs": len(ratios)}
    target = comparisons.get("hvdazure / horovod")
    return {"bandwidth_ratios_at_1MB_and_more": comparisons,
            "target": {"hvdazure / horovod >=": TARGET,
                       "verdict": stats.at_least_verdict(tuple(target["ci95"]), TARGET) if target else
                       "not measured"}}


def _size_label(nbytes: int) -> str:
    return f"{nbytes // MB} MB" if nbytes >= MB else f"{nbytes // KB} KB"


class Allreduce(RankBenchmark):
    """One job of -np ranks; on its ranks, every peer at every message size."""

    name = "allreduce"

    def check(self, options: Options) -> None:
        if options["np"] < 2:
            raise BenchError("allreduce needs at least 2 ranks (-np 2)")

    def measure(self, options: Options) -> Result | None:
        """On every rank: time each peer at each size; rank 0 returns the figures."""
        import horovod.torch as hvd
        import torch

        hvd.init()
        if torch.cuda.is_available():
            torch.cuda.set_device(hvd.local_rank())
        device = rank_device(torch, hvd)
        op, quick = options["op"], options["quick"]
        peers = [*_hvdazure_peers(hvd, torch, op), _horovod_peer(hvd, op),
                 *_torch_distributed_peers(hvd, torch, op), _mpi4py_peer(hvd, op, options["controller"])]
        active = [p for p in peers if p.skipped is None]
        repeats, warmup = (2, 1) if quick else (5, 3)

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize()

        rows = []
        sizes = message_sizes(quick)
        started = time.monotonic()
        for index, nbytes in enumerate(sizes):
            iters = iterations(nbytes, quick)
            tensor = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
            runs = {p.name: p.setup(tensor) for p in active if p.setup is not None}
            for p in active:
                for _ in range(warmup):
                    runs[p.name]()
            times: dict[str, list[float]] = {p.name: [] for p in active}
            for repeat in range(repeats):
                shift = (index + repeat) % len(active)  # rotate who goes first
                for p in active[shift:] + active[:shift]:
                    hvd.barrier()
                    sync()
                    start = time.perf_counter()
                    for _ in range(iters):
                        runs[p.name]()
                    sync()
                    elapsed = (time.perf_counter() - start) / iters
                    # the collective is done when the slowest rank is done
                    times[p.name].append(float(hvd.allreduce(torch.tensor(elapsed), op=hvd.Max,
                                                             name="bench.elapsed")))
            for name, values in times.items():
                rows.append(_row(name, nbytes, iters, values, hvd.size(), op))
            del runs, tensor
            if hvd.rank() == 0:
                progress(f"{op} {_size_label(nbytes)} done ({index + 1}/{len(sizes)}, "
                         f"{time.monotonic() - started:.0f} s)")
        if hvd.rank() != 0:
            return None
        return {"op": op, "world_size": hvd.size(), "device": device.type, "repeats": repeats,
                "warmup": warmup, "sizes": sizes,
                "peers": {p.name: {"status": "skipped", "reason": p.skipped} if p.skipped else
                          {"status": "measured"} for p in peers},
                "rows": rows, "summary": summarize(rows)}

    def table(self, result: Result) -> str:
        """Per size: each peer's latency and bus bandwidth; then skipped peers, the ratios and the target."""
        lines = [f"{result['op']} on {result['world_size']} ranks ({result['device']}, "
                 f"{result['machine']['controller']}); median of {result['repeats']} interleaved repeats"]
        lines.append(f"{'size':>8}  {'peer':<24}{'latency us':>12}{'algbw GB/s':>12}{'busbw GB/s':>12}")
        for r in result["rows"]:
            lines.append(f"{_size_label(r['bytes']):>8}  {r['peer']:<24}{r['latency_us']:>12.1f}"
                         f"{r['algbw_GBps']:>12.3f}{r['busbw_GBps']:>12.3f}")
        for name, peer in result["peers"].items():
            if peer["status"] == "skipped":
                lines.append(f"skipped: {name}: {peer['reason']}")
        summary = result["summary"]
        for name, c in summary["bandwidth_ratios_at_1MB_and_more"].items():
            lines.append(f"bandwidth {name} at >= 1 MB: median {c['median']:.3f}, 95% interval "
                         f"{c['ci95'][0]:.3f}-{c['ci95'][1]:.3f} ({c['pairs']} paired repeats)")
        lines.append(f"target hvdazure / horovod >= {TARGET}: {summary['target']['verdict']}")
        return "\n".join(lines)

    def plot(self, result: Result, path: Path) -> None:
        """Bus bandwidth (algorithm bandwidth on one rank) against message size, log-log, a line per peer."""
        plt = pyplot()

        key = "busbw_GBps" if result["world_size"] > 1 else "algbw_GBps"
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for peer in dict.fromkeys(r["peer"] for r in result["rows"]):
            rows = [r for r in result["rows"] if r["peer"] == peer]
            ax.plot([r["bytes"] for r in rows], [r[key] for r in rows], marker="o", label=peer)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(f"{key.split('_')[0]} (GB/s)")
        ax.set_title(f"{result['op']}, {result['world_size']} ranks, {result['device']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        save_figure(fig, path)


if __name__ == "__main__":
    from hvdazure.bench.runner import main

    sys.exit(main("allreduce"))
