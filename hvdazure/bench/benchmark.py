"""The benchmark protocol: what every `hvdazure bench NAME` is, and the two kinds there are.

A benchmark checks its options before any process starts, runs from the launching process and returns its
raw result (JSON), and renders a result as a table and a plot. It is one of two kinds:

- a `RankBenchmark` measures on ranks: every rank of a job it starts runs its `measure` (through
  `python -m hvdazure.bench.rank NAME`) and rank 0's return value comes back. By default `run` starts one
  job of -np ranks; a benchmark that combines several jobs (one per framework, 1 and N ranks, ...) says so
  by overriding `run`.
- any other `Benchmark` starts its own processes in `run` (launch times bare launchers against
  `hvdazure run`), with no ranks of its own.

The launching process starts jobs through the `Jobs` it is given (jobs.py holds the one that starts them
on this machine), so that a benchmark never imports the launcher, and none of this imports a framework.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

Options = dict[str, Any]
"""What a benchmark's processes need from the command line (JSON-serialisable): options.as_options."""
Result = dict[str, Any]
"""A benchmark's figures (JSON-serialisable), as written to --json with the options and machine's facts."""


class BenchError(Exception):
    """A benchmark could not run or its ranks failed; the message is one line for the user."""


class Jobs(Protocol):
    """How a benchmark starts rank jobs of its own `measure` from the launching process."""

    @property
    def timeout_s(self) -> float | None:
        """A job or process that runs longer is stopped (None: never)."""
        ...

    def run_ranks(self, name: str, options: Options, num_proc: int, *, tag: str = "",
                  env: Mapping[str, str] | None = None) -> Result:
        """`measure(options)` of benchmark `name` on a job of `num_proc` ranks; what rank 0 returned."""
        ...

    def single_rank_processes(self, name: str, options: Options, count: int,
                              env: Mapping[str, str]) -> list[Result]:
        """`count` single-rank processes of `measure(options)` at once, without a launcher; their results."""
        ...


class Benchmark(ABC):
    """One benchmark of `hvdazure bench`: checked, run, reported."""

    name: ClassVar[str]  # its name in the registry, `hvdazure bench NAME` and `hvdazure.bench.NAME`

    def check(self, options: Options) -> None:  # noqa: B027 (most benchmarks take every option)
        """Raise BenchError, before any process starts, for options this benchmark cannot run with."""

    @abstractmethod
    def run(self, options: Options, jobs: Jobs) -> Result:
        """In the launching process: start the benchmark's jobs and return its raw result."""

    @abstractmethod
    def table(self, result: Result) -> str:
        """The result (with its "options" and "machine") as the text `hvdazure bench` prints."""

    @abstractmethod
    def plot(self, result: Result, path: Path) -> None:
        """The result drawn into the PNG at `path` (--plot)."""


class RankBenchmark(Benchmark):
    """A benchmark measured on ranks: `measure` runs on every rank of each job it starts."""

    def run(self, options: Options, jobs: Jobs) -> Result:
        """One job of -np ranks; rank 0's result."""
        return jobs.run_ranks(self.name, options, options["np"])

    @abstractmethod
    def measure(self, options: Options) -> Result | None:
        """On every rank of a job: measure; rank 0 returns the figures, the other ranks None."""


def progress(text: str) -> None:
    """A progress line during a long run (from rank 0, rank-tagged by the launcher, or the launching
    process)."""
    print(f"bench: {text}", flush=True)
