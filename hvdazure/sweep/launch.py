"""Starting a sweep on this machine or on given hosts: `hvdazure sweep` and `hvdazure.sweep.run_sweep`.

One `mpirun` starts every rank (the MPI controller: under Gloo, Horovod ignores the communicator a trial's
group starts on), through the same supervisor as `hvdazure run`: rank-tagged output, no orphans, SIGTERM
to every rank on Ctrl-C or a timeout (running trials save a checkpoint and resume when the sweep is
started again with the same output folder).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hvdazure.sweep.options import SweepOptions, per_rank_command
from hvdazure.sweep.results import SweepResults, load
from hvdazure.sweep.space import SpaceError
from hvdazure.sweep.worker import LAUNCHED_ENV


@dataclass(frozen=True)
class SweepRun:
    """How a sweep ended: the job's exit code and the results it wrote (None if it wrote none)."""

    exit_code: int
    results: SweepResults | None


def check(options: SweepOptions, num_proc: int) -> None:
    """Everything that can fail before a process starts: the options, the space, and mpi4py (present, and
    built against Horovod's MPI). Raises SpaceError (a ConfigError) with one line."""
    options.check(num_proc)
    options.check_same_as_saved()
    from hvdazure.launch.mpi_libraries import mpi4py_problem

    problem = mpi4py_problem()
    if problem:
        raise SpaceError(problem)


def run_sweep(options: SweepOptions, num_proc: int, hosts: str | None = None, hostfile: str | None = None,
              network_interface: str | None = None, timeout_s: float | None = None, grace_s: float = 30.0,
              verbose: bool = False, env: dict[str, str] | None = None) -> SweepRun:
    """Run the sweep on `num_proc` ranks in groups of `options.ranks_per_trial`; print the results table."""
    from hvdazure.launch.command import LaunchSpec
    from hvdazure.launch.supervisor import run_job

    check(options, num_proc)
    spec = LaunchSpec(num_proc=num_proc, command=per_rank_command(options, sys.executable), hosts=hosts,
                      hostfile=hostfile, controller="mpi", extra_env={LAUNCHED_ENV: "1", **(env or {})},
                      network_interface=network_interface)
    job = run_job(spec, timeout_s=timeout_s, grace_s=grace_s, verbose=verbose)
    results = load(options)
    if results is not None and job.exit_code == 0:
        print(results.table(), flush=True)
    elif results is not None:
        print(results.table(), flush=True)
        print(f"hvdazure sweep: stopped (exit code {job.exit_code}); start it again with --output "
              f"{options.output} to resume", file=sys.stderr, flush=True)
    return SweepRun(job.exit_code, results)


def sweep(script: str, space: str, metric: str, num_proc: int, *, ranks_per_trial: int = 1, trials: int = 10,
          mode: str = "min", sampler: str = "tpe", pruner: str = "none", seed: int = 0,
          output: str = "sweeps/sweep", mlflow: bool = False, script_args: Sequence[str] = (),
          **launch: Any) -> SweepRun:
    """The Python API of `hvdazure sweep`: run `script` as trials of a hyperparameter search on `num_proc`
    ranks, `ranks_per_trial` per trial; `launch` takes run_sweep's hosts, timeout_s, grace_s, ..."""
    options = SweepOptions(script=script, space=space, metric=metric, trials=trials,
                           ranks_per_trial=ranks_per_trial, mode=mode, sampler=sampler, pruner=pruner,
                           seed=seed, output=output, mlflow=mlflow, script_args=script_args)
    return run_sweep(options, num_proc, **launch)
