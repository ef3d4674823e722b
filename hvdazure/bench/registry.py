"""Every benchmark of `hvdazure bench`, by name: the CLI's choices, what the runner and the ranks run.

A name maps to the class that implements it, as "module:Class", loaded on first use: the CLI's parser
reads the names without importing any benchmark (nor NumPy with it), so `hvdazure --help` stays fast.
"""

from __future__ import annotations

import importlib

from hvdazure.bench.benchmark import Benchmark, RankBenchmark

BENCHMARKS: dict[str, str] = {
    "allreduce": "hvdazure.bench.allreduce:Allreduce",
    "overhead": "hvdazure.bench.overhead:Overhead",
    "throughput": "hvdazure.bench.throughput:Throughput",
    "checkpoint": "hvdazure.bench.checkpoint:Checkpoint",
    "launch": "hvdazure.bench.launch:Launch",
    "data": "hvdazure.bench.data:Data",
    "peers": "hvdazure.bench.peers:Peers",
}
NAMES = tuple(BENCHMARKS)


def module_name(name: str) -> str:
    """The module of benchmark `name`: `python -m MODULE` runs it."""
    return BENCHMARKS[name].partition(":")[0]


def load(name: str) -> Benchmark:
    """The benchmark called `name` (one of NAMES)."""
    module, _, cls = BENCHMARKS[name].partition(":")
    benchmark = getattr(importlib.import_module(module), cls)()
    if not isinstance(benchmark, Benchmark) or benchmark.name != name:
        raise TypeError(f"{BENCHMARKS[name]} is not the Benchmark {name!r}")
    return benchmark


def load_rank_benchmark(name: str) -> RankBenchmark:
    """The benchmark called `name`, which must measure on ranks (what rank.py runs)."""
    benchmark = load(name)
    if not isinstance(benchmark, RankBenchmark):
        raise TypeError(f"benchmark {name!r} runs no ranks of its own")
    return benchmark
