"""Starting a benchmark's rank processes on this machine: a job started as `hvdazure run` starts jobs, or
single-rank processes without a launcher. Each runs `python -m hvdazure.bench.rank NAME OPTIONS OUT`; rank 0
writes its result to OUT, read back here.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hvdazure.bench.benchmark import BenchError, Options, Result
from hvdazure.bench.processes import Command, run_together


def rank_command(name: str, options_path: Path, out_path: Path) -> list[str]:
    """The command line of one rank of benchmark `name` (rank.py)."""
    return [sys.executable, "-m", "hvdazure.bench.rank", name, str(options_path), str(out_path)]


@dataclass(frozen=True)
class LocalJobs:
    """The `Jobs` of `hvdazure bench`: rank jobs on this machine under `controller` ("gloo" or "mpi")."""

    controller: str
    timeout_s: float | None = None
    verbose: bool = False  # also show the launcher's report on failure

    def run_ranks(self, name: str, options: Options, num_proc: int, *, tag: str = "",
                  env: Mapping[str, str] | None = None) -> Result:
        """`measure(options)` of benchmark `name` on `num_proc` ranks; return what rank 0 returned."""
        from hvdazure.launch.command import LaunchSpec
        from hvdazure.launch.supervisor import run_job

        with tempfile.TemporaryDirectory(prefix="hvdazure-bench-") as folder:
            spec_path, out_path = Path(folder) / "options.json", Path(folder) / "result.json"
            spec_path.write_text(json.dumps(dict(options)))
            spec = LaunchSpec(num_proc=num_proc, command=rank_command(name, spec_path, out_path),
                              controller=self.controller,
                              extra_env={"PYTHONUNBUFFERED": "1", **(env or {})})
            job = run_job(spec, timeout_s=self.timeout_s, grace_s=5.0, verbose=self.verbose)
            if job.exit_code != 0:
                raise BenchError(f"{name}{tag}: the job on {num_proc} ranks failed "
                                 f"(exit code {job.exit_code})")
            if not out_path.is_file():
                raise BenchError(f"{name}{tag}: rank 0 wrote no result")
            result: Result = json.loads(out_path.read_text())
            return result

    def single_rank_processes(self, name: str, options: Options, count: int,
                              env: Mapping[str, str]) -> list[Result]:
        """`count` single-rank processes at once, without a launcher (each is a Horovod job of one); each
        one's result. On a failure, the first failed process's output goes to stderr."""
        with tempfile.TemporaryDirectory(prefix="hvdazure-bench-") as folder:
            spec = Path(folder) / "options.json"
            spec.write_text(json.dumps(options))
            outs = [Path(folder) / f"result{i}.json" for i in range(count)]
            commands = [Command(rank_command(name, spec, out), {**os.environ, **env},
                                Path(folder) / f"log{i}.txt") for i, out in enumerate(outs)]
            codes = run_together(commands, self.timeout_s, f"{name}: {count} single-rank processes")
            if any(codes) or not all(o.is_file() for o in outs):
                failed = next(i for i, code in enumerate(codes) if code or not outs[i].is_file())
                sys.stderr.write(commands[failed].log.read_text())
                raise BenchError(f"{name}: a single-rank process failed (exit codes {codes}; output above)")
            return [json.loads(o.read_text()) for o in outs]
