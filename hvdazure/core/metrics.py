"""Metric accumulation across steps and ranks, with one fused allreduce per reduction.

Each rank adds per-batch means with their sample counts (values may stay device tensors: nothing is
synchronised until `reduce`). `reduce` sends every sum, the sample count and any extra flags in a single
allreduce(sum), so the result is the exact mean over all samples on all ranks, identical on every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Sums a list of numbers (floats or framework scalars) elementwise across ranks, returning floats.
AllreduceSum = Callable[[Sequence[Any]], list[float]]


class MetricAccumulator:
    """Sample-weighted sums of named metrics since the last `reduce`."""

    def __init__(self) -> None:
        self._sums: dict[str, Any] = {}
        self._count = 0

    def add(self, metrics: Mapping[str, Any], count: int) -> None:
        """Add one batch's metrics (means over its `count` samples). A count of 0 registers the names only,
        so that every rank reduces the same list even when it had no samples."""
        for name, value in metrics.items():
            if count:
                self._sums[name] = self._sums.get(name, 0.0) + value * count
            else:  # a stand-in batch's value must not reach the sum, not even as nan * 0
                self._sums.setdefault(name, 0.0)
        self._count += count

    @property
    def names(self) -> list[str]:
        return sorted(self._sums)

    def reduce(self, allreduce_sum: AllreduceSum, flags: Sequence[float] = ()) -> tuple[dict[str, float], int,
                                                                                         list[float]]:
        """(global means, global sample count, summed flags) in one collective; then start afresh.
        Every rank must call this at the same point with the same metric names."""
        names = self.names
        totals = allreduce_sum([*(self._sums[n] for n in names), float(self._count), *flags])
        count = round(totals[len(names)])
        means = {n: totals[i] / count if count else float("nan") for i, n in enumerate(names)}
        self._sums, self._count = {}, 0
        return means, count, list(totals[len(names) + 1 :])


class RunningMean:
    """Means over many reduced intervals (already global), weighted by their sample counts."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._count = 0

    def add(self, means: Mapping[str, float], count: int) -> None:
        for name, value in means.items():
            self._sums[name] = self._sums.get(name, 0.0) + value * count
        self._count += count

    def means(self) -> dict[str, float]:
        return {n: s / self._count for n, s in self._sums.items()} if self._count else {}

    def to_dict(self) -> dict[str, Any]:
        return {"sums": dict(self._sums), "count": self._count}

    def load_dict(self, data: Mapping[str, Any]) -> None:
        self._sums, self._count = dict(data["sums"]), int(data["count"])
