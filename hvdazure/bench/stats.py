"""The statistics the benchmarks report: bus bandwidth, bootstrap intervals, scaling efficiency, verdicts.

Pure functions of their inputs (NumPy only), so each is unit-tested with known numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

BOOTSTRAP_SEED = 12345  # fixed: the same data give the same interval


def bus_bandwidth(algorithm_bandwidth: float, world_size: int, op: str = "allreduce") -> float:
    """nccl-tests' bus bandwidth: the algorithm bandwidth times the share of the data each link carries, so
    that figures compare across world sizes: allreduce 2(n-1)/n, allgather (n-1)/n, broadcast 1."""
    n = world_size
    factor = {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n, "broadcast": 1.0}[op]
    return algorithm_bandwidth * factor


def bootstrap_interval(values: npt.ArrayLike, statistic: Callable[[np.ndarray], float] = np.median,
                       resamples: int = 2000, level: float = 0.95,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over `values` (seeded: reproducible)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values to bootstrap")
    rng = np.random.default_rng(seed)
    samples = data[rng.integers(0, data.size, size=(resamples, data.size))]
    estimates = np.apply_along_axis(statistic, 1, samples)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(estimates, [tail, 100 - tail])
    return float(low), float(high)


def ratio_interval(numerators: Sequence[float], denominators: Sequence[float], scale: float = 1.0,
                   resamples: int = 2000, level: float = 0.95,
                   seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Bootstrap interval of mean(numerators) / (scale x mean(denominators)), the two samples resampled
    independently (two separate measurements, e.g. the N-rank and the 1-rank throughput)."""
    a, b = np.asarray(numerators, dtype=float), np.asarray(denominators, dtype=float)
    rng = np.random.default_rng(seed)
    means_a = a[rng.integers(0, a.size, size=(resamples, a.size))].mean(axis=1)
    means_b = b[rng.integers(0, b.size, size=(resamples, b.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means_a / (scale * means_b), [tail, 100 - tail])
    return float(low), float(high)


def scaling_efficiency(total_n: float, total_1: float, world_size: int) -> float:
    """Weak-scaling efficiency: total throughput on N ranks over N times the throughput of one rank."""
    return total_n / (world_size * total_1)


def verdict(interval: tuple[float, float], target: float) -> str:
    """For a ratio that should stay at or below `target`: "met" when the whole interval is at or below it,
    "not met" when the whole interval is above it, "undecided" when the interval straddles it."""
    low, high = interval
    if high <= target:
        return "met"
    if low > target:
        return "not met"
    return "undecided"


def at_least_verdict(interval: tuple[float, float], target: float) -> str:
    """The same for a figure that should reach at least `target` (bandwidth share, efficiency)."""
    low, high = interval
    if low >= target:
        return "met"
    if high < target:
        return "not met"
    return "undecided"


def summary(values: npt.ArrayLike) -> dict[str, Any]:
    """Mean, median, min, max and the bootstrap 95% interval of the mean."""
    data = np.asarray(values, dtype=float)
    low, high = bootstrap_interval(data, np.mean)
    return {"mean": float(data.mean()), "median": float(np.median(data)), "min": float(data.min()),
            "max": float(data.max()), "ci95": [low, high], "n": int(data.size)}
