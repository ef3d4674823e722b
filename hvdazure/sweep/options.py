"""The settings of a sweep, shared by `hvdazure sweep` (which launches the ranks), the per-rank entry point
`python -m hvdazure.sweep` (what Azure ML's mpirun starts for an in-job sweep) and the Python API.

Everything that can be checked before a process starts is checked here, in one line per problem.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from hvdazure.launch.options import add_job_arguments
from hvdazure.sweep.space import SearchSpace, SpaceError

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("none", "median", "hyperband")
SETTINGS_FILE = "sweep.json"  # the settings a sweep started with, in its output folder
P = TypeVar("P", bound=argparse.ArgumentParser)  # the CLI's parser class: its subcommands' parsers are one


@dataclass(frozen=True)
class SweepOptions:
    """What to search: SCRIPT (run unmodified, with its own ARGS) once per trial on `ranks_per_trial` ranks,
    `trials` trials in all, optimising `metric` (a key of the trainer's history, e.g. eval_loss)."""

    script: str
    space: str  # the space.yaml file
    metric: str
    trials: int = 10
    ranks_per_trial: int = 1
    mode: str = "min"
    sampler: str = "tpe"
    pruner: str = "none"
    seed: int = 0
    output: str = "sweeps/sweep"
    mlflow: bool = False  # trials log to MLflow as child runs of one run for the sweep
    script_args: Sequence[str] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "script_args", tuple(self.script_args))

    def check(self, world_size: int | None = None) -> SearchSpace:
        """Validate everything (the space included) and return the search space; SpaceError on a problem."""
        if not Path(self.script).is_file():
            raise SpaceError(f"script not found: {self.script}")
        if self.trials < 1:
            raise SpaceError(f"--trials must be at least 1, got {self.trials}")
        if self.ranks_per_trial < 1:
            raise SpaceError(f"--ranks-per-trial must be at least 1, got {self.ranks_per_trial}")
        if world_size is not None and (world_size < 1 or world_size % self.ranks_per_trial):
            raise SpaceError(f"-np {world_size} is not a multiple of --ranks-per-trial "
                             f"{self.ranks_per_trial}: every rank must belong to a trial's group")
        if self.mode not in ("min", "max"):
            raise SpaceError(f"--mode must be min or max, got {self.mode!r}")
        if self.sampler not in SAMPLERS:
            raise SpaceError(f"--sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if self.pruner not in PRUNERS:
            raise SpaceError(f"--pruner must be one of {', '.join(PRUNERS)}, got {self.pruner!r}")
        if not self.metric:
            raise SpaceError("--metric must name a metric of the trainer's history, e.g. eval_loss")
        space = SearchSpace.from_yaml(self.space)
        space.optuna_distributions()  # distributions Optuna has no equivalent of fail here
        if self.sampler == "grid":
            space.grid()
        return space

    @property
    def output_dir(self) -> Path:
        return Path(self.output)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "script_args": list(self.script_args)}

    def save(self, space: SearchSpace) -> None:
        """Write the settings into the output folder; a restarted sweep must search the same thing."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path = self.output_dir / SETTINGS_FILE
        before = json.loads(path.read_text()) if path.is_file() else {}
        settings = {**before, **self.to_dict(), "space_parameters": [p.describe() for p in space.parameters]}
        path.write_text(json.dumps(settings, indent=2) + "\n")

    def check_same_as_saved(self) -> None:
        """A sweep restarted in the same --output goes on with the trials there: it must search the same
        script, space and objective (trial counts and the script's arguments may change)."""
        path = self.output_dir / SETTINGS_FILE
        if not path.is_file():
            return
        saved = json.loads(path.read_text())
        space_now = SearchSpace.from_yaml(self.space)
        for key in ("metric", "mode", "sampler", "ranks_per_trial"):
            if saved.get(key) != getattr(self, key):
                raise SpaceError(f"--output {self.output} holds a sweep with {key.replace('_', '-')} "
                                 f"{saved.get(key)!r}, not {getattr(self, key)!r}: use another --output to "
                                 "start a new sweep")
        saved_space = saved.get("space_parameters")
        if saved_space is not None and saved_space != [p.describe() for p in space_now.parameters]:
            raise SpaceError(f"--output {self.output} holds a sweep of another search space "
                             f"({'; '.join(saved_space)}): use another --output to start a new sweep")


def add_search_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """What every sweep takes, wherever its trials run (`hvdazure sweep`, `hvdazure submit sweep` and
    `hvdazure submit in-job-sweep`): the space, the objective and the number of trials. Returns the group,
    for the sampler options of the caller's kind of sweep."""
    group = parser.add_argument_group("search")
    group.add_argument("--space", required=True, metavar="SPACE.yaml",
                       help="search space: TrainConfig fields / extra.NAME with Azure ML's distributions")
    group.add_argument("--metric", required=True,
                       help="the metric to optimise, as the trainer reports it (eval_NAME, train_NAME), e.g. "
                            "eval_loss")
    group.add_argument("--mode", default="min", choices=("min", "max"), help="minimise (default) or not")
    group.add_argument("--trials", type=int, default=10, help="trials in all (default: 10; a grid: at most "
                                                              "its size)")
    return group


def add_optuna_arguments(group: argparse._ArgumentGroup) -> None:
    """How Optuna searches, where hvdazure runs the trials itself (`hvdazure sweep`, `hvdazure submit
    in-job-sweep`): groups of ranks, the sampler, the pruner and the seed."""
    group.add_argument("--ranks-per-trial", type=int, default=1, metavar="R",
                       help="ranks of each trial's data-parallel group (default: 1)")
    group.add_argument("--sampler", default="tpe", choices=SAMPLERS, help="Optuna sampler (default: tpe)")
    group.add_argument("--pruner", default="none", choices=PRUNERS,
                       help="stop unpromising trials early from their per-epoch metric (default: none)")
    group.add_argument("--seed", type=int, default=0, help="the sampler's seed; trial N trains with seed+N")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The sweep's options, as `hvdazure sweep` and `python -m hvdazure.sweep` take them."""
    parser.add_argument("script", help="the training script (the same as for `hvdazure run`)")
    add_optuna_arguments(add_search_arguments(parser))
    parser.add_argument("--mlflow", action="store_true",
                        help="log every trial to MLflow, as a child run of one run for the sweep (in Azure "
                             "ML: the job's run; else a SQLite store in --output)")
    parser.add_argument("--output", default="sweeps/sweep", metavar="DIR",
                        help="results, trials and the Optuna journal; run again with the same DIR to resume")


def add_parser(sub: argparse._SubParsersAction[P]) -> P:
    """`hvdazure sweep -np N SCRIPT ...`: the sweep's options with the job's (those of `hvdazure run`).
    Returns the parser, for the CLI to give it what runs it and the script's arguments (after --)."""
    sweep = sub.add_parser(
        "sweep", help="hyperparameter search: many data-parallel trials at once in one MPI job (Optuna)",
        description="Run SCRIPT (unmodified, as for `hvdazure run`) as the trials of a hyperparameter search "
                    "on N ranks under one mpirun: the ranks are split into groups of --ranks-per-trial, each "
                    "group trains one trial at a time with Horovod on its own MPI sub-communicator and takes "
                    "the next trial when done. Each trial's config is the script's config plus the trial's "
                    "parameters, with its own output and checkpoint folder under --output. Results: a table, "
                    "results.json, results.csv, best.yaml (for --config) and sweep.png in --output. Started "
                    "again with the same --output, a stopped sweep resumes. Uses the MPI controller (Horovod "
                    "ignores sub-communicators under Gloo) and mpi4py built against Horovod's MPI.",
        epilog="the script's own arguments go after --. example:\n"
               "  hvdazure sweep -np 8 --ranks-per-trial 2 train.py --space space.yaml --trials 24 \\\n"
               "      --metric eval_loss --mode min --pruner median --output sweeps/run1 -- --set epochs=10",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sweep.add_argument("-np", "--num-proc", dest="np", type=int, required=True,
                       help="ranks in all: a multiple of --ranks-per-trial")
    add_arguments(sweep)
    add_job_arguments(sweep)
    sweep.set_defaults(script_args=[])
    return sweep


def from_namespace(args: argparse.Namespace) -> SweepOptions:
    """The options `hvdazure sweep` parsed (`add_arguments`), as a SweepOptions."""
    return SweepOptions(script=args.script, space=args.space, metric=args.metric, trials=args.trials,
                        ranks_per_trial=args.ranks_per_trial, mode=args.mode, sampler=args.sampler,
                        pruner=args.pruner, seed=args.seed, output=args.output, mlflow=args.mlflow,
                        script_args=list(args.script_args))


def per_rank_command(options: SweepOptions, python: str) -> list[str]:
    """The command every rank runs: `python -m hvdazure.sweep` with the same options."""
    o = options
    return [python, "-m", "hvdazure.sweep", o.script, "--space", o.space, "--trials", str(o.trials),
            "--ranks-per-trial", str(o.ranks_per_trial), "--metric", o.metric, "--mode", o.mode,
            "--sampler", o.sampler, "--pruner", o.pruner, "--seed", str(o.seed), "--output", o.output,
            *(["--mlflow"] if o.mlflow else []), "--", *o.script_args]
