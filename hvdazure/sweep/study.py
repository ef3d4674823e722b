"""The Optuna study behind a sweep: its samplers and pruners (Optuna's own, not ours), kept in a journal file
in the sweep's output folder so that a stopped sweep resumes with every finished trial."""

from __future__ import annotations

import logging
from typing import Any

from hvdazure.sweep.options import SweepOptions
from hvdazure.sweep.space import SearchSpace

JOURNAL_FILE = "optuna.journal"
STUDY_NAME = "hvdazure-sweep"


def make_study(options: SweepOptions, space: SearchSpace) -> Any:
    """Create the sweep's study, or load the one in `options.output` (resuming)."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(logging.WARNING)  # the sweep prints its own lines, once per trial
    options.output_dir.mkdir(parents=True, exist_ok=True)
    storage = JournalStorage(JournalFileBackend(str(options.output_dir / JOURNAL_FILE)))
    return optuna.create_study(storage=storage, study_name=STUDY_NAME, load_if_exists=True,
                               direction="minimize" if options.mode == "min" else "maximize",
                               sampler=make_sampler(options, space), pruner=make_pruner(options))


def make_sampler(options: SweepOptions, space: SearchSpace) -> Any:
    import optuna

    if options.sampler == "grid":
        return optuna.samplers.GridSampler(space.grid(), seed=options.seed)
    if options.sampler == "random":
        return optuna.samplers.RandomSampler(seed=options.seed)
    # constant_liar: trials running concurrently count as if at their worst, so groups that ask at the same
    # time are not all sent to the same promising point
    return optuna.samplers.TPESampler(seed=options.seed, constant_liar=True)


def make_pruner(options: SweepOptions) -> Any:
    """Pruners judge a trial by its metric after each epoch against other trials at the same epoch."""
    import optuna

    if options.pruner == "median":
        # worse than the median of finished trials at the same epoch, from the second epoch on (the first is
        # often LR warm-up), once one trial has finished: sweeps here are tens of trials, not hundreds
        return optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=1)
    if options.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1)
    return optuna.pruners.NopPruner()


def total_trials(options: SweepOptions, space: SearchSpace) -> int:
    """Trials the sweep runs in all: --trials, and for a grid no more than the grid has points."""
    return min(options.trials, space.grid_size()) if options.sampler == "grid" else options.trials
