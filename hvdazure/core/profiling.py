"""Profiler traces of a few training steps (config field `profile_steps`, `hvdazure run --profile`): which
steps, which rank, where, and what the log says, decided here once for every framework; the framework's
profiler sits behind `StepProfiler`, which each binding's backend gives (torch.profiler, TensorFlow's).

The policy:
- Steps are the run's optimizer steps as TensorBoard's step axis numbers them: from 1, counted across epochs
  and resumes. A range that ends past the end of training is refused before training, on every rank (what was
  asked for could not be recorded); steps trained before this fit() began (a resumed run, a second fit())
  are skipped with a line saying so, as a job restarted after a preemption must go on, not fail.
- Rank 0 records. The other ranks run the same steps unprofiled: a trace per rank would multiply the
  profiler's cost and files for steps that look alike (`hvdazure run --timeline` shows the ranks side by
  side, and the step-time breakdown their spread).
- The trace goes to `output_dir/profile`, beside `output_dir/tensorboard`; rank 0 checks before training
  that it can write there, and every rank raises the same one-line error when it cannot.
- The trace spans each step from before its `on_step_begin` callbacks to after its `on_step_end` ones, and
  marks each step with the run's step number (`ProfilerStep#N`; TensorFlow's step markers), so that tools
  find the steps. Once it is written, rank 0 logs one line: where it is and how to open it.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.rank_logging import logger
from hvdazure.core.sample_plan import SamplePlan
from hvdazure.core.state import TrainState
from hvdazure.core.step_times import StepTimes

PROFILE_ENV = "HVDAZURE_PROFILE_STEPS"  # set by `hvdazure run --profile` for every rank; over the config's
PROFILE_DIR = "profile"  # under output_dir

# How each kind of trace is opened, from the file's folder
_VIEWERS = {
    "chrome": "open it in https://ui.perfetto.dev or chrome://tracing",
    "tensorboard": "open it with `tensorboard --logdir {directory}`, Profile tab (pip install "
                   "tensorboard-plugin-profile)",
}


@dataclass(frozen=True)
class ProfilerTrace:
    """A trace a profiler wrote: its file, and its kind (`chrome`: a Chrome trace JSON; `tensorboard`: a
    TensorBoard profile run, `plugins/profile/RUN/HOST.xplane.pb` under the directory it was given)."""

    path: str
    kind: Literal["chrome", "tensorboard"]


class StepProfiler(ABC):
    """A framework's profiler, as the core starts and stops it around the steps it records (rank 0 only)."""

    @abstractmethod
    def start(self, directory: Path, label: str) -> None:
        """Start recording; the trace will go into `directory` (which exists), named after `label` where the
        format lets the name be chosen (`steps-5-8-rank0`)."""

    @abstractmethod
    def begin_step(self, step: int) -> None:
        """Step `step` begins: mark it in the trace under that number."""

    @abstractmethod
    def end_step(self) -> None:
        """The step begun last has ended."""

    @abstractmethod
    def stop(self) -> ProfilerTrace:
        """Stop recording and write the trace, whole (never a part of one under its final name)."""


def with_profile_from(environ: Mapping[str, str], config: TrainConfig) -> TrainConfig:
    """`config` with the steps PROFILE_ENV names (`hvdazure run --profile`), which win over its own; a
    ConfigError naming the variable for a value that is not a step range."""
    steps = environ.get(PROFILE_ENV)
    if steps is None or steps == config.profile_steps:
        return config
    try:
        return config.replace(profile_steps=steps)
    except ConfigError as exc:
        raise ConfigError(f"{PROFILE_ENV}={steps!r} (hvdazure run --profile): {exc}") from None


def check_writable(directory: Path) -> None:
    """Make `directory` if need be and check that a file can be written in it; an OSError in one line naming
    it if not. The check leaves nothing but the directory."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".hvdazure-write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OSError(f"cannot write the profiler trace into {directory} ({exc.strerror or exc})") from None


def steps_to_profile(asked: range, fit_steps: range, ends_because: str) -> range:
    """The steps of `asked` this fit() records: those of `fit_steps` (the steps it will train, unless it
    stops early). A ConfigError, before training, for a range past its end; steps trained before it are
    left out, with a line saying so."""
    if asked.stop > fit_steps.stop:
        shown = str(asked.start) if len(asked) == 1 else f"{asked.start}-{asked[-1]}"
        raise ConfigError(f"config field 'profile_steps': {shown!r} goes past the end of training, at step "
                          f"{fit_steps.stop - 1} ({ends_because}): profile steps up to {fit_steps.stop - 1}")
    kept = range(max(asked.start, fit_steps.start), asked.stop)
    if len(kept) < len(asked):
        before = _span(asked.start, min(asked.stop, fit_steps.start) - 1)
        logger.info(f"profile_steps: {before} trained before this fit() began, at step {fit_steps.start}: "
                    f"{'no trace' if not kept else 'not in the trace'}")
    return kept


class ProfiledSteps:
    """The profiler of one fit() on one rank: started before the first step of `steps`, each step marked,
    stopped after the last (or when fit() ends first). `profiler` None: this rank records nothing. The
    trace's writing is left out of the step times (`times`): it is not training's time."""

    def __init__(self, profiler: StepProfiler | None, steps: range, directory: Path, rank: int,
                 times: StepTimes | None = None) -> None:
        self.profiler = profiler if steps else None
        self.steps, self.directory, self.rank = steps, directory, rank
        self.times = times if times is not None else StepTimes(enabled=False)
        self.trace: ProfilerTrace | None = None  # once written
        self._running = False

    @classmethod
    def off(cls) -> ProfiledSteps:
        return cls(None, range(0), Path(), 0)

    def step_begins(self, step: int) -> None:
        if self.profiler is None or step not in self.steps:
            return
        if step == self.steps.start:
            label = f"steps-{self.steps.start}-{self.steps[-1]}-rank{self.rank}"
            self.profiler.start(self.directory, label)
            self._running = True
            logger.info(f"recording a profiler trace of {_span(step, self.steps[-1])} (rank {self.rank})")
        self.profiler.begin_step(step)

    def step_ended(self, step: int) -> None:
        if self.profiler is None or not self._running:
            return
        self.profiler.end_step()
        if step == self.steps[-1]:
            self._stop(step)

    def finish(self, step: int) -> None:
        """fit() ends, at `step`: a profiler still running (training stopped early, or failed) writes what
        it recorded. Never raises: fit() may be ending on an error of its own."""
        if self.profiler is None or not self._running:
            return
        try:
            self._stop(step, early=True)
        except Exception as exc:
            logger.warning(f"the profiler trace could not be written: {exc}")

    def _stop(self, last: int, early: bool = False) -> None:
        self._running = False
        assert self.profiler is not None
        since = self.times.now()
        self.trace = trace = self.profiler.stop()
        self.times.leave_out(since)
        first = self.steps.start
        ended = f", of {_span(first, self.steps[-1])}, as training ended" if early else ""
        how = _VIEWERS[trace.kind].format(directory=self.directory)
        logger.info(f"profiler trace of {_span(first, last)}{ended} (rank {self.rank}) written to "
                    f"{trace.path}; {how}")


def _span(first: int, last: int) -> str:
    """`step 5` or `steps 5-8`."""
    return f"step {first}" if last <= first else f"steps {first}-{last}"


def profiled_steps(config: TrainConfig, profiler: Callable[[], StepProfiler | None], fit_steps: range,
                   ends_because: str, rank: int, on_rank0_for_all: Callable[[Callable[[], None]], None],
                   times: StepTimes) -> ProfiledSteps:
    """The profiling of a fit() about to train `fit_steps`, on this rank, checked before training on every
    rank: the range against the end of training (`ends_because`: what ends it), the framework's profiler
    (`profiler`, the backend's), and rank 0's output directory (`on_rank0_for_all`: runs a check on rank 0
    and raises its failure on every rank; a collective, entered only when there are steps to record).
    `times`: this rank's step times, which the trace's writing is left out of."""
    asked = config.profile_range
    if asked is None:
        return ProfiledSteps.off()
    steps = steps_to_profile(asked, fit_steps, ends_because)
    made = profiler()
    if made is None:
        raise ConfigError("config field 'profile_steps': this trainer's framework has no profiler")
    directory = Path(config.output_dir) / PROFILE_DIR
    if steps:
        on_rank0_for_all(lambda: check_writable(directory))
    return ProfiledSteps(made if rank == 0 else None, steps, directory, rank, times)


def profile_this_fit(config: TrainConfig, state: TrainState, plan: SamplePlan,
                     profiler: Callable[[], StepProfiler | None], rank: int,
                     on_rank0_for_all: Callable[[Callable[[], None]], None],
                     times: StepTimes) -> ProfiledSteps:
    """What the fit() about to start records a trace of (`profiled_steps`), checked on every rank against
    the steps it will train: those left of its epochs (from `state`, by `plan`'s steps per epoch), up to
    max_steps."""
    c, s = config, state
    epochs_left = max(0, c.epochs - s.epoch - 1)  # after the one in progress
    last = s.step + plan.steps_left(s.samples_in_epoch) + epochs_left * plan.steps_per_epoch
    ends_because = f"epochs {c.epochs} of {plan.steps_per_epoch} steps at this world size"
    if c.max_steps is not None and c.max_steps < last:
        last, ends_because = c.max_steps, f"max_steps {c.max_steps}"
    return profiled_steps(c, profiler, range(s.step + 1, last + 1), ends_because, rank, on_rank0_for_all,
                          times)
