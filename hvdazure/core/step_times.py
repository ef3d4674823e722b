"""Where the training time goes: each rank's seconds per phase, summed per log interval, reduced over ranks in
the interval's one fused collective (they ride with the metrics' flags: no collective of their own), and
shown as shares of the wall time in the log line, TensorBoard and MLflow, and as a table once, at the end
of fit(), with a line of advice when one phase stands out, true to the run (`RunFacts`: no "MPI instead of
Gloo" on MPI). The table also shows after the fit's first log interval when that interval is abnormal
(`abnormal_early`): a loader that starves the model shows within seconds, not at the end.

Phases are timed with the host's clock at their edges (a few `perf_counter` calls per step): the loop times
the data wait (the step's batches taken from the loader), evaluation and checkpoint stalls; the backend its
step's phases: `compute` (forward and backward), `exchange` (waiting for the gradients' allreduce, what is
left of it after the overlap with backward; with `zero_stage` 2 the reduce-scatter's) and `optimizer` (the
update), or `step` for TensorFlow's one compiled function holding all three; with `zero_stage` also
`gather` (the allgather of the updated slices into every rank's weights, after the update). `other` is the
rest of the wall time: callbacks, logging, the metric reduction. The first step of each fit() is `startup`
(the loader's workers starting, compilation, the first allocations): reported in seconds, kept out of the
shares so that it does not read as a slow loader.

On an accelerator, each rank's row also carries the device's peak memory in the interval (allocated by
tensors, and reserved by the framework's caching allocator: what the device really gave, what an
out-of-memory error is about) and its utilization (the backend's `device_stats`), shown per rank as the
largest and smallest, since ranks differ (the rank holding the model's largest layers, rank 0's extra work).
Where the device says nothing (CPUs, no NVML for the utilization, no reserved memory in TensorFlow's
statistics) its value is NaN and nothing is shown.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hvdazure.core.rank_logging import logger

# The phases a rank times, in the order of the reduced row; "other" and "startup" are derived.
PHASES = ("data", "compute", "exchange", "optimizer", "step", "checkpoint", "eval", "gather")
_SHOWN = ("data", "compute", "exchange", "optimizer", "gather", "step", "checkpoint", "eval")  # table order
_LABELS = {"data": "data wait", "compute": "forward+backward", "exchange": "allreduce wait",
           "optimizer": "optimizer", "gather": "allgather wait", "step": "compiled step",
           "checkpoint": "checkpoint stall", "eval": "evaluation", "other": "other"}


def _label(phase: str, facts: RunFacts) -> str:
    """A phase's name in the table and the advice: `exchange` is a reduce-scatter with zero_stage 2."""
    return "reducescatter wait" if phase == "exchange" and facts.zero_stage == 2 else _LABELS[phase]
# the device's columns, after the phases: bytes, bytes, percent; NaN: unknown
DEVICE = ("peak_bytes", "reserved_bytes", "utilization")
ROW_LENGTH = 4 + len(PHASES) + len(DEVICE)  # wall, startup, steps, samples, each phase's seconds, device


def no_device() -> tuple[float, float, float]:
    """The device columns of a rank that has no accelerator to report on."""
    return math.nan, math.nan, math.nan


class StepTimes:
    """This rank's clock for the loop and the backend: `since = times.now()` at a phase's start, then
    `times.add(phase, since)` at its end. Off (`enabled=False`), both are one attribute test. `device`:
    the device's columns of an interval (see DEVICE), asked once per row."""

    def __init__(self, enabled: bool = True, clock: Callable[[], float] = time.perf_counter,
                 device: Callable[[], Sequence[float]] = no_device) -> None:
        self.enabled, self._clock, self._device = enabled, clock, device
        self._seconds = dict.fromkeys(PHASES, 0.0)
        self._start = clock()
        self._startup = 0.0
        self._steps = self._samples = 0

    def now(self) -> float:
        return self._clock() if self.enabled else 0.0

    def add(self, phase: str, since: float) -> float:
        """Charge the time since `since` to `phase`; returns the clock's reading (the next phase's start)."""
        if not self.enabled:
            return 0.0
        now = self._clock()
        self._seconds[phase] += now - since
        return now

    def leave_out(self, since: float) -> None:
        """The time since `since` was not training's (writing a profiler trace): it is taken out of the
        interval's wall time, where it would read as `other`."""
        if self.enabled:
            self._start += self._clock() - since

    def step_done(self, samples: int, first_of_fit: bool) -> None:
        """An optimizer step of `samples` samples (all ranks together) has ended. The first of a fit() is
        start-up: the interval's time so far is `startup` (part of the wall time), not the phases'."""
        if not self.enabled:
            return
        if first_of_fit:
            self._startup = self._clock() - self._start
            self._seconds = dict.fromkeys(PHASES, 0.0)
            return
        self._steps += 1
        self._samples += samples

    def row(self) -> list[float]:
        """This rank's interval since the last row (see ROW_LENGTH; the wall time includes the start-up),
        then a new interval; [] when off."""
        if not self.enabled:
            return []
        now = self._clock()
        row = [now - self._start, self._startup, float(self._steps), float(self._samples),
               *(self._seconds[p] for p in PHASES), *self._device()]
        self._seconds, self._start, self._startup, self._steps, self._samples = (
            dict.fromkeys(PHASES, 0.0), now, 0.0, 0, 0)
        return row


@dataclass(frozen=True)
class Spread:
    """A per-rank number's largest and smallest value over the ranks that know it, and which ranks."""

    high: float
    high_rank: int
    low: float
    low_rank: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        """Over `values` in rank order, NaN (unknown) left out; None when no rank knows it."""
        known = [(value, rank) for rank, value in enumerate(values) if not math.isnan(value)]
        if not known:
            return None
        (high, high_rank), (low, low_rank) = max(known), min(known)
        return cls(high, high_rank, low, low_rank)


@dataclass(frozen=True)
class _Measure:
    """How a device number is shown: its table label, log-line label, scalar name, and unit."""

    label: str
    short: str
    scalar: str
    scale: float
    digits: str
    unit: str

    def number(self, value: float) -> str:
        return f"{value * self.scale:{self.digits}}"

    def compact(self, spread: Spread) -> str:
        """`gpu peak 10.1-11 GiB` (lowest-highest), or one value where the ranks agree."""
        low, high = self.number(spread.low), self.number(spread.high)
        return f"{self.short} {low if low == high else f'{low}-{high}'}{self.unit}"


_MEMORY = _Measure("gpu memory peak", "gpu peak", "gpu_memory_peak_gib", 2.0**-30, ".3g", " GiB")
_RESERVED = _Measure("gpu reserved peak", "reserved", "gpu_memory_reserved_gib", 2.0**-30, ".3g", " GiB")
_UTILIZATION = _Measure("gpu utilization", "util", "gpu_utilization", 1.0, ".0f", "%")


@dataclass
class DeviceUse:
    """Each rank's accelerator over some intervals: its peak memory allocated and reserved (bytes, the
    largest of the intervals') and utilization (percent, the mean of the intervals' readings); NaN where the
    rank does not know."""

    peak_bytes: list[float] = field(default_factory=list)
    reserved_bytes: list[float] = field(default_factory=list)
    utilization_sum: list[float] = field(default_factory=list)
    utilization_count: list[int] = field(default_factory=list)

    def add_rows(self, rows: Sequence[Sequence[float]]) -> None:
        """Add an interval: each rank's device columns (DEVICE), in rank order."""
        if not self.peak_bytes:
            self.peak_bytes, self.reserved_bytes = [math.nan] * len(rows), [math.nan] * len(rows)
            self.utilization_sum, self.utilization_count = [0.0] * len(rows), [0] * len(rows)
        for rank, (peak, reserved, utilization) in enumerate(rows):
            self.peak_bytes[rank] = _larger(self.peak_bytes[rank], peak)
            self.reserved_bytes[rank] = _larger(self.reserved_bytes[rank], reserved)
            if not math.isnan(utilization):
                self.utilization_sum[rank] += utilization
                self.utilization_count[rank] += 1

    def add(self, other: DeviceUse) -> None:
        self.add_rows([(peak, reserved, math.nan)
                       for peak, reserved in zip(other.peak_bytes, other.reserved_bytes, strict=True)])
        for rank, count in enumerate(other.utilization_count):
            self.utilization_sum[rank] += other.utilization_sum[rank]
            self.utilization_count[rank] += count

    def spreads(self) -> list[tuple[_Measure, Spread]]:
        """The peak memory's and the mean utilization's spread over the ranks, those that some rank knows."""
        utilization = [total / count if count else math.nan
                       for total, count in zip(self.utilization_sum, self.utilization_count, strict=True)]
        measured = ((_MEMORY, self.peak_bytes), (_RESERVED, self.reserved_bytes),
                    (_UTILIZATION, utilization))
        return [(measure, spread) for measure, values in measured
                if (spread := Spread.of(values)) is not None]

    def compact(self) -> str:
        """The log line's part, `gpu peak 10.1-11 GiB reserved 12-13 GiB util 85-97%`; empty when no rank
        knows any."""
        return " ".join(measure.compact(spread) for measure, spread in self.spreads())

    def scalars(self) -> dict[str, float]:
        """For TensorBoard and MLflow: the highest and lowest rank's, `gpu_memory_peak_gib_max`, `_min`,
        `gpu_memory_reserved_gib_max`, `_min`, and `gpu_utilization_max`, `_min` (percent)."""
        scalars = {}
        for measure, spread in self.spreads():
            scalars[f"{measure.scalar}_max"] = spread.high * measure.scale
            scalars[f"{measure.scalar}_min"] = spread.low * measure.scale
        return scalars

    def table_lines(self) -> list[str]:
        """`gpu memory peak   max 11 GiB (rank 0), min 10.1 GiB (rank 3)`, per number some rank knows."""
        return [f"  {m.label:<18}max {m.number(s.high)}{m.unit} (rank {s.high_rank}), "
                f"min {m.number(s.low)}{m.unit} (rank {s.low_rank})" for m, s in self.spreads()]


def _larger(known: float, reading: float) -> float:
    """The larger of two peaks, NaN (unknown) counting for nothing."""
    return reading if math.isnan(known) else known if math.isnan(reading) else max(known, reading)


@dataclass
class Breakdown:
    """Reduced intervals added up: every phase's seconds and the wall time, means over the ranks, and each
    rank's device use."""

    ranks: int = 1
    wall: float = 0.0
    startup: float = 0.0
    steps: int = 0
    samples: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    device: DeviceUse = field(default_factory=DeviceUse)

    def add_rows(self, rows: Sequence[Sequence[float]]) -> None:
        """Add an interval: every rank's row (StepTimes.row), in rank order (steps and samples are the same
        on every rank)."""
        ranks = self.ranks = len(rows)
        summed = [math.fsum(column) for column in zip(*(row[:4 + len(PHASES)] for row in rows), strict=True)]
        self.wall += summed[0] / ranks
        self.startup += summed[1] / ranks
        self.steps += round(summed[2] / ranks)
        self.samples += round(summed[3] / ranks)
        for i, phase in enumerate(PHASES):
            self.seconds[phase] += summed[4 + i] / ranks
        self.device.add_rows([row[4 + len(PHASES):] for row in rows])

    def add(self, other: Breakdown) -> None:
        self.ranks = other.ranks
        self.wall += other.wall
        self.startup += other.startup
        self.steps += other.steps
        self.samples += other.samples
        for phase in PHASES:
            self.seconds[phase] += other.seconds[phase]
        self.device.add(other.device)

    @property
    def timed(self) -> float:
        """The wall time the shares are of: all but start-up."""
        return max(self.wall - self.startup, 0.0)

    def shares(self) -> dict[str, float]:
        """Each phase's share of the timed wall time (phases never timed left out), and `other`'s."""
        timed = self.timed
        if timed <= 0.0:
            return {}
        shares = {p: self.seconds[p] / timed for p in _SHOWN if self.seconds[p] > 0.0 or p == "data"}
        shares["other"] = max(0.0, 1.0 - sum(shares.values()))
        return shares

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.timed if self.timed > 0.0 else 0.0

    def compact(self) -> str:
        """The log line's part: `time data 12% compute 61% ... other 4%`, then the device's, if known."""
        device = self.device.compact()
        return "time " + " ".join(f"{p} {100 * s:.0f}%" for p, s in self.shares().items()) + (
            f" | {device}" if device else "")

    def scalars(self) -> dict[str, float]:
        """For TensorBoard and MLflow: each share (0..1) as `time_<phase>`, `samples_per_s`, and the device's
        (DeviceUse.scalars), if known."""
        shares = {f"time_{p}": s for p, s in self.shares().items()}
        return {**shares, "samples_per_s": self.samples_per_second, **self.device.scalars()}

    def table(self, title: str, facts: RunFacts | None = None) -> str:
        """Seconds per step and shares, start-up apart, and advice where a phase stands out, for a run
        that `facts` describe (None: advice that holds for any run)."""
        shares, steps = self.shares(), max(self.steps, 1)
        facts = dataclasses.replace(facts or RunFacts(), accelerator=bool(self.device.spreads()))
        lines = [f"{title}: {self.steps} steps in {self.timed:.3g} s on {self.ranks} rank(s) "
                 f"(mean over ranks), {self.samples_per_second:.4g} samples/s",
                 f"  {'phase':<18}{'ms/step':>10}{'share':>8}"]
        for phase, share in shares.items():
            seconds = self.seconds.get(phase, share * self.timed)
            lines.append(f"  {_label(phase, facts):<18}{1000 * seconds / steps:>10.3g}{100 * share:>7.1f}%")
        if self.startup:
            lines.append(f"  {'first step':<18}{1000 * self.startup:>10.3g}   (start-up, not in the shares)")
        lines.extend(self.device.table_lines())
        lines.extend(f"  {line}" for line in advice(shares, facts))
        return "\n".join(lines)

    def abnormal_early(self) -> str | None:
        """Why this first interval's table is worth showing before the end of fit() (see
        EARLY_DATA_WAIT_SHARE), or None."""
        data = self.shares().get("data", 0.0)
        if data > EARLY_DATA_WAIT_SHARE:
            return f"data wait {100 * data:.0f}% of the first steps' time"
        return None


@dataclass(frozen=True)
class RunFacts:
    """What the advice depends on besides the shares: the controller Horovod runs on ("gloo", "mpi", or
    "none": unknown), the machines the ranks are on, the config's `grad_allreduce`, `checkpoint_async` and
    `zero_stage` (which names the exchange), and whether the ranks have accelerators (the table knows it from
    the device columns)."""

    controller: str = "none"
    nodes: int = 1
    grad_allreduce: str = "auto"
    checkpoint_async: bool = True
    accelerator: bool = False
    zero_stage: int = 0


# A loader that starves the model costs every step from the first one on, and its fix (workers, read-ahead)
# is best made before a long run: above this share in the fit's first interval, the table shows at once.
EARLY_DATA_WAIT_SHARE = 0.25


# Above which share a phase stands out, and what to try (docs: guides/performance.md).
_THRESHOLDS = {"data": EARLY_DATA_WAIT_SHARE, "exchange": 0.30, "checkpoint": 0.10, "eval": 0.30,
               "other": 0.25}


def _remedies(phase: str, facts: RunFacts) -> str:
    """What usually helps when `phase` stands out, only what applies to a run that `facts` describe."""
    if phase == "data":
        return ("the model waits for data: more loader workers (num_workers), a sharded dataset's "
                "read-ahead, or lighter per-sample work")
    if phase == "exchange":
        fixes = ["a larger batch_size (fewer exchanges per sample)"]
        if facts.controller == "gloo":
            where = "across machines" if facts.nodes > 1 else "through shared memory on one machine"
            fixes.append(f"the MPI controller (hvdazure run --mpi), which exchanges {where} faster than Gloo")
        if facts.accelerator and facts.grad_allreduce == "after_backward":
            fixes.append("grad_allreduce overlap (the exchange during backward)")
        listed = fixes[0] if len(fixes) == 1 else f"{', '.join(fixes[:-1])} or {fixes[-1]}"
        return f"the gradient exchange dominates: {listed}"
    if phase == "checkpoint":
        fix = "" if facts.checkpoint_async else "checkpoint_async true, or "
        return f"checkpoints stall training: {fix}checkpoint less often"
    if phase == "eval":
        return "evaluation takes much of the time: eval_every, or a smaller evaluation set"
    return "time goes outside the step: callbacks, logging (log_every), or Python work between steps"


def advice(shares: dict[str, float], facts: RunFacts | None = None) -> list[str]:
    """One line per phase above its usual threshold, the largest first; none for a healthy breakdown. Only
    remedies that apply to the run (`facts`; None: those that apply to any run)."""
    facts = facts or RunFacts()
    found = [(shares[p], f"{_label(p, facts)} {100 * shares[p]:.0f}%: {_remedies(p, facts)} (see 'Why is my "
                         "training slow?')") for p, threshold in _THRESHOLDS.items()
             if shares.get(p, 0.0) > threshold]
    return [line for _, line in sorted(found, reverse=True)]


class FitTimes:
    """The reduced phase times of the loop's fit(): the log interval's (`interval`, added to as each
    interval's collective brings the ranks' rows), the whole fit's, and the last interval's for the loggers
    (`last`, kept across fits). Rank 0 logs the table of the fit at its end, and after the fit's first
    interval when that one is abnormal (`Breakdown.abnormal_early`)."""

    def __init__(self) -> None:
        self.interval = Breakdown()  # the reduced phase times since the last log line
        self.fit = Breakdown()  # and since this fit() began
        self.last: Breakdown | None = None  # the last log interval's, for the loggers

    def begin(self) -> None:
        """A fit() begins: its times start from nothing (`last` stays, until its first interval ends)."""
        self.fit, self.interval = Breakdown(), Breakdown()

    def interval_ends(self, is_main: bool, fit_steps: int, facts: Callable[[], RunFacts]) -> None:
        """A log interval ends: its phase times are the loggers' (`last`) and the fit's. The table is the
        end's, once; after the fit's first interval rank 0 logs it early only when that interval is
        abnormal (a starved loader shows within seconds). `fit_steps`: the fit's steps so far."""
        self.last, first = self.interval, not self.fit.steps
        self.fit.add(self.interval)
        self.interval = Breakdown()
        why = self.last.abnormal_early() if first and is_main and self.last.steps else None
        if why is not None:
            logger.info(self.last.table(f"where the time went, steps 2-{fit_steps} (shown now: {why})",
                                        facts()))

    def fit_ends(self, rows: Sequence[Sequence[float]], is_main: bool, facts: Callable[[], RunFacts]) -> None:
        """fit() ends: `rows`, each rank's times left since the last interval (reduced), join the fit's, and
        rank 0 logs the table of the whole fit()."""
        self.interval.add_rows(rows)
        self.fit.add(self.interval)
        self.interval = Breakdown()
        if is_main and self.fit.steps:
            logger.info(self.fit.table("where the time went in fit() (the first step apart)", facts()))
