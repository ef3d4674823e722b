"""Metric accumulation across steps and ranks, with one fused collective per reduction.

Each rank adds per-batch means with their sample counts (values may stay device tensors: nothing is
synchronised until `reduce`), summed in float64 whatever the batch's dtype. `reduce` sends every rank's
sums, per-metric sample counts, total sample count and any extra flags in a single allgather, and every
rank adds the rows up in rank order: the result is the exact mean over all samples on all ranks, identical
on every rank.

Ranks need not report the same metrics (a metric logged on some batches only, a rank left without samples):
each row carries a fingerprint of its metric names, and when the rows disagree the ranks exchange the names
(a second collective, entered by all ranks since all see the same rows) and average each metric over the
samples that reported it. Values are matched by name, never by position, so two different sets of metrics
are never summed together and no rank waits on a collective the others do not enter.

Each value added must be one number, the batch's mean: a hook that returns more (per-sample losses where a
mean belongs, softmax probabilities) is refused at once in one line naming the hook, the metric and its
shape (`check_metric_shape`, which the bindings also apply where shapes are known before values are).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hvdazure.core.config import ConfigError
from hvdazure.core.rank_logging import logger

# Every rank's row of numbers (floats or framework scalars), on every rank, in rank order.
GatherRows = Callable[[Sequence[Any]], list[list[float]]]
# Every rank's list of metric names, on every rank, in rank order.
GatherNames = Callable[[list[str]], list[list[str]]]


@dataclass(frozen=True)
class Reduced:
    """The outcome of a reduction, identical on every rank."""

    means: dict[str, float]  # each metric's mean over the samples, on all ranks, that reported it
    counts: dict[str, int]  # how many samples reported each metric
    count: int  # samples added on all ranks
    flags: list[float]  # each flag summed over ranks
    flags_by_rank: list[list[float]] = field(default_factory=list)  # each rank's flags, in rank order


class HookReturnError(ConfigError):
    """A user's hook returned what the loop cannot use (a loss or metric that is not one number per batch,
    no dict of metrics); the message names the hook and what it returned. Shown as one line, with the
    bad-input exit status 2, as a ConfigError is: every rank returns the same kind of value."""


def check_metric_shape(hook: str, name: str, shape: Sequence[int | None] | None,
                       per_sample: bool = False) -> None:
    """A HookReturnError unless a value of `shape` that `hook` returned as `name` is one number (a batch
    mean), or with `per_sample` one number per sample (a first dimension of unknown size, the batch's; the
    TensorFlow binding averages those, as Keras's losses and metrics return them). Shapes come as far as
    they are known: None for an unknown rank, None for a dimension of unknown size; what they leave
    possible passes."""
    if shape is None:
        return
    dims = list(shape)
    if per_sample and dims and dims[0] is None:
        dims = dims[1:]
    if all(d is None or d == 1 for d in dims):
        return
    what = "a loss" if (hook, name) == ("training_step", "loss") else f"metric {name!r}"
    rule = "the mean over the batch (one number)"
    if per_sample:
        rule += " or one value per sample (shape (batch,)), which hvdazure averages"
    raise HookReturnError(f"{hook} returned {what} of shape {tuple(shape)}: it must be {rule}")


def names_fingerprint(names: Sequence[str]) -> float:
    """48 bits of a hash of the metric names, exact as a float64 (a row is a vector of float64)."""
    digest = hashlib.sha256("\0".join(names).encode()).digest()
    return float(int.from_bytes(digest[:6], "big"))


class MetricAccumulator:
    """Sample-weighted sums of named metrics since the last `reduce`.

    `to_float64` converts one value to float64 without leaving its device (the binding's cast): a bf16 loss
    summed over thousands of batches in bf16 would lose all but 3 significant digits. `hook`: the user's
    hook the values come from, named when one is not a number."""

    def __init__(self, to_float64: Callable[[Any], Any] = float, hook: str = "training_step") -> None:
        self._to_float64, self.hook = to_float64, hook
        self._sums: dict[str, Any] = {}
        self._counts: dict[str, int] = {}
        self._samples = 0

    def add(self, metrics: Mapping[str, Any], count: int) -> None:
        """Add one batch's metrics (means over its `count` samples, each one number: a HookReturnError
        otherwise). A batch of no samples adds nothing."""
        self._add(metrics, count, self.hook)
        self._samples += count

    def add_logged(self, metrics: Mapping[str, Any], count: int) -> None:
        """Add metrics a step logged besides its batch's (Trainer.log_metrics), weighted by `count`, the
        samples they speak for; the samples themselves are counted with the batch."""
        self._add(metrics, count, "log_metrics")

    def _add(self, metrics: Mapping[str, Any], count: int, hook: str) -> None:
        if count:
            for name, value in metrics.items():
                shape = getattr(value, "shape", ())  # a tensor's or array's, read without synchronising
                if shape:
                    check_metric_shape(hook, name, tuple(shape))
                self._sums[name] = self._sums.get(name, 0.0) + self._to_float64(value) * count
                self._counts[name] = self._counts.get(name, 0) + count

    @property
    def names(self) -> list[str]:
        return sorted(self._sums)

    @property
    def samples(self) -> int:
        """Samples added on this rank since the last reduce."""
        return self._samples

    def row(self, flags: Sequence[float] = ()) -> list[Any]:
        """What this rank contributes: fingerprint, sample count, flags, then each metric's sum and count."""
        names = self.names
        return [names_fingerprint(names), float(self._samples), *flags, *(self._sums[n] for n in names),
                *(float(self._counts[n]) for n in names)]

    def reduce(self, gather_rows: GatherRows, gather_names: GatherNames,
               flags: Sequence[float] = ()) -> Reduced:
        """Global means, sample count and summed flags; then start afresh. Every rank calls this at the same
        point with the same number of flags."""
        names = self.names
        rows = gather_rows(self.row(flags))
        self._sums, self._counts, self._samples = {}, {}, 0
        return combine_rows(rows, names, len(flags), gather_names)


def combine_rows(rows: list[list[float]], names: list[str], num_flags: int,
                 gather_names: GatherNames) -> Reduced:
    """Add up every rank's row (see MetricAccumulator.row), in rank order. `names` are this rank's."""
    head = 2 + num_flags
    if len({(row[0], len(row)) for row in rows}) == 1:  # every rank reports the same metrics
        names_by_rank = [names] * len(rows)
    else:
        names_by_rank = gather_names(names)
        _note_differing_metrics(names_by_rank)
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for row, rank_names in zip(rows, names_by_rank, strict=True):
        n = len(rank_names)
        for i, name in enumerate(rank_names):
            sums[name] = sums.get(name, 0.0) + row[head + i]
            counts[name] = counts.get(name, 0.0) + row[head + n + i]
    reported = sorted(name for name in sums if counts[name])
    flags = [sum(row[2 + i] for row in rows) for i in range(num_flags)]
    return Reduced(means={name: sums[name] / counts[name] for name in reported},
                   counts={name: round(counts[name]) for name in reported},
                   count=round(sum(row[1] for row in rows)), flags=flags,
                   flags_by_rank=[list(row[2:head]) for row in rows])


_noted: set[tuple[tuple[str, ...], ...]] = set()


def _note_differing_metrics(names_by_rank: list[list[str]]) -> None:
    """Say once (rank 0) that ranks report different metrics: often a metric returned on some batches only."""
    distinct = tuple(sorted({tuple(names) for names in names_by_rank if names}))
    if len(distinct) > 1 and distinct not in _noted:
        _noted.add(distinct)
        described = "; ".join(f"rank {rank}: {', '.join(names) or '(none)'}"
                              for rank, names in enumerate(names_by_rank))
        logger.info(f"ranks report different metrics ({described}); each metric is averaged over the "
                    "samples that reported it")


class RunningMean:
    """Means over many reduced intervals (already global), each metric weighted by its sample counts."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def add(self, reduced: Reduced) -> None:
        for name, value in reduced.means.items():
            count = reduced.counts[name]
            self._sums[name] = self._sums.get(name, 0.0) + value * count
            self._counts[name] = self._counts.get(name, 0) + count

    def means(self) -> dict[str, float]:
        return {n: s / self._counts[n] for n, s in self._sums.items()}

    def reset(self) -> None:
        """Forget every interval: a new epoch begins."""
        self._sums, self._counts = {}, {}

    def state_dict(self) -> dict[str, Any]:
        return {"sums": dict(self._sums), "counts": dict(self._counts)}

    def load_state_dict(self, data: Mapping[str, Any]) -> None:
        self._sums = dict(data["sums"])
        counts = data.get("counts")  # checkpoints before per-metric counts kept one count for all
        self._counts = {n: int(counts[n]) for n in self._sums} if counts is not None else \
            dict.fromkeys(self._sums, int(data["count"]))
