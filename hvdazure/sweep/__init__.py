"""Hyperparameter search with data-parallel trials: many Horovod trainings at once in one MPI job, each on its
own group of ranks (mpi4py sub-communicators), driven by Optuna. `hvdazure sweep` on the command line;
`hvdazure.sweep.sweep(...)` from Python. Imports nothing heavy until a sweep runs."""

from __future__ import annotations

from typing import Any

__all__ = ["SearchSpace", "SweepOptions", "SweepRun", "sweep"]


def __getattr__(name: str) -> Any:  # lazy: `import hvdazure.sweep` stays cheap
    if name in ("sweep", "SweepRun", "run_sweep"):
        from hvdazure.sweep import launch

        return getattr(launch, name)
    if name == "SweepOptions":
        from hvdazure.sweep.options import SweepOptions

        return SweepOptions
    if name == "SearchSpace":
        from hvdazure.sweep.space import SearchSpace

        return SearchSpace
    raise AttributeError(f"module 'hvdazure.sweep' has no attribute {name!r}")
