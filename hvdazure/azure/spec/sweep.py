"""Hyperparameter sweeps on Azure ML as `hvdazure submit` takes them, validated offline; no Azure SDK here.

One search space file (hvdazure/sweep/space.py, in Azure ML's distributions) and two ways to search it:

- `hvdazure submit sweep` (SweepSpec): an Azure ML sweep job. Each trial is the MPI command job `hvdazure
  submit` builds (nodes x processes per node), started by Azure ML with sampled values, which reach the
  script as `--set NAME=VALUE`. Azure ML reads the objective from each trial's MLflow run, so the trial's
  command turns the trainer's MLflow logging on (`--set mlflow=true`; inside Azure ML it logs into the
  trial's own run). SDK v2's SweepJob (v2/sweep.py) and SDK v1's HyperDriveConfig (v1/sweep.py) are built
  from one resolved SweepJob (resolved_job.py).
- `hvdazure submit in-job-sweep` (InJobSweepSpec): one MPI command job whose ranks all run `python -m
  hvdazure.sweep` (Optuna, trials of --ranks-per-trial ranks on mpi4py sub-communicators): one allocation,
  trials packed onto its GPUs.

What Azure ML would refuse only after the upload, or not at all, is refused here in one line: search-space
keys must be identifiers (`extra.hidden` becomes the key `extra_hidden`; two names that become one key are an
error); grid sampling takes choice parameters only, Bayesian sampling choice, uniform and quniform and no
early termination; counts, percentages and factors out of range; a trial timeout under a minute (as every
duration: spec/settings.py); an in-job sweep whose trials do not divide the job's ranks; a sweep job's output
registered as an asset (each trial writes its own). A `--set FIELD=...` of the script's own that the search
space overrides in every trial is a warning naming the field.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hvdazure.azure import script_args
from hvdazure.azure.errors import JobSpecError, check_count
from hvdazure.azure.resolved_job import (
    GOALS,
    EarlyTermination,
    InJobSweep,
    ResolvedJob,
    SearchParameter,
    SweepJob,
)
from hvdazure.azure.spec import credential_check
from hvdazure.azure.spec.settings import check_duration

if TYPE_CHECKING:
    from hvdazure.core.config import TrainConfig
    from hvdazure.sweep.space import SearchSpace

SAMPLERS = ("random", "grid", "bayesian")  # Azure ML's; an in-job sweep has Optuna's (hvdazure.sweep.options)
POLICIES = ("bandit", "median", "truncation")
BAYESIAN_KINDS = ("choice", "uniform", "quniform")  # what Azure ML's Bayesian sampling accepts
IN_JOB_OUTPUT = "./outputs/sweep"  # Azure ML uploads ./outputs with the job
_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True)
class SweepSpec:
    """`hvdazure submit sweep`: an Azure ML sweep job whose trials are the job's MPI command job."""

    space: str
    metric: str  # an MLflow metric every trial logs: hvdazure's trainer logs eval_NAME and train_NAME
    mode: str = "min"
    trials: int = 10
    max_concurrent_trials: int | None = None  # default: every trial (the cluster's size queues the rest)
    sampler: str = "random"
    seed: int | None = None  # random sampling only
    early_termination: EarlyTermination | None = None
    trial_timeout: int | str | None = None  # 5400, "1h30m": each trial's (SDK v1: its max_run_duration)
    # the whole sweep job's: JobSpec.max_duration, as for every job


@dataclass(frozen=True)
class InJobSweepSpec:
    """`hvdazure submit in-job-sweep`: `hvdazure sweep` inside one MPI command job (the space file must be in
    the uploaded code directory)."""

    space: str
    metric: str  # a key of the trainer's history, e.g. eval_loss
    mode: str = "min"
    trials: int = 10
    ranks_per_trial: int = 1
    sampler: str = "tpe"
    pruner: str = "none"
    seed: int = 0


def early_termination(policy: str | None, evaluation_interval: int | None = None,
                      delay_evaluation: int | None = None, slack_factor: float | None = None,
                      truncation_percentage: int | None = None) -> EarlyTermination | None:
    """The policy `hvdazure submit sweep --early-termination POLICY ...` asks for (None: not given). An
    option that does not go with the policy asked for is an error, not ignored."""
    if policy is None or policy == "none":
        for option, value in (("--evaluation-interval", evaluation_interval),
                              ("--delay-evaluation", delay_evaluation), ("--slack-factor", slack_factor),
                              ("--truncation-percentage", truncation_percentage)):
            if value is not None:
                raise JobSpecError(f"{option} goes with --early-termination bandit, median or truncation")
        return None
    if policy not in POLICIES:
        raise JobSpecError(f"--early-termination {policy!r}: expected none, {', '.join(POLICIES)}")
    if slack_factor is not None and policy != "bandit":
        raise JobSpecError(f"--slack-factor goes with --early-termination bandit, not {policy}")
    if truncation_percentage is not None and policy != "truncation":
        raise JobSpecError(f"--truncation-percentage goes with --early-termination truncation, not {policy}")
    default = EarlyTermination(policy)
    interval = default.evaluation_interval if evaluation_interval is None else evaluation_interval
    delay = default.delay_evaluation if delay_evaluation is None else delay_evaluation
    return EarlyTermination(policy, evaluation_interval=interval, delay_evaluation=delay,
                            slack_factor=slack_factor, truncation_percentage=truncation_percentage)


# --- resolution -------------------------------------------------------------------------------------------
def apply(sweep: SweepSpec | InJobSweepSpec, job: ResolvedJob, *, config: TrainConfig | None,
          cwd: Path) -> ResolvedJob:
    """`job` (the validated command job) turned into the sweep asked for: its kind, decided here once.
    Raises JobSpecError naming what to change. `config` is the TrainConfig the script's own arguments give
    (None: they give none)."""
    match sweep:
        case InJobSweepSpec():
            return _in_job_sweep(sweep, job, cwd)
        case SweepSpec():
            return _sweep_job(sweep, job, config, cwd)
    raise JobSpecError(f"sweep {sweep!r}: expected a SweepSpec or an InJobSweepSpec")


def _sweep_job(spec: SweepSpec, job: ResolvedJob, config: TrainConfig | None, cwd: Path) -> ResolvedJob:
    sweep = resolve_sweep(spec, cwd)
    if config is not None and config.mlflow_tracking_uri:
        raise JobSpecError(f"the script's arguments set mlflow_tracking_uri, so trials would log "
                           f"{sweep.metric} there and Azure ML's sweep would never see it: leave it "
                           "unset (inside Azure ML, MLflow logs into each trial's own run)")
    warnings = [*job.warnings, *_metric_warning(sweep.metric)]
    warnings += _overridden(job.script_args, [p.name for p in sweep.parameters], sweep.space_file.name)
    warnings += [f"--output {out.name} has a fixed URI: every trial of the sweep writes to {out.uri}"
                 for out in job.outputs if out.uri]
    for out in job.outputs:
        if out.asset_name is not None:
            raise JobSpecError(f"--output {out.name}: name={out.asset_name} registers a job's output, and "
                               "each trial of a sweep writes its own: register the best trial's after the "
                               "sweep (az ml model create or az ml data create, from azureml://jobs/TRIAL/"
                               f"outputs/{out.name})")
    # Azure ML reads the objective from each trial's MLflow run: the trainer logs only with mlflow on
    return dataclasses.replace(job, script_args=(*job.script_args, "--set", "mlflow=true"), kind=sweep,
                               warnings=tuple(warnings))


def resolve_sweep(spec: SweepSpec, cwd: Path) -> SweepJob:
    """Validate an Azure ML sweep (everything but the trial, which spec.job.resolve checks)."""
    space_file = cwd / spec.space
    if not space_file.is_file():
        raise JobSpecError(f"--space {spec.space}: search space file not found")
    space = _load_space(space_file)
    credential_check.check_search_space(space)  # the job holds the search space
    parameters = search_parameters(space)
    if not isinstance(spec.metric, str) or not spec.metric.strip():
        raise JobSpecError("--metric: name the MLflow metric every trial logs, e.g. eval_loss")
    if spec.mode not in GOALS:
        raise JobSpecError(f"--mode {spec.mode!r}: expected min or max")
    trials = check_count(spec.trials, "--trials")
    concurrent = trials if spec.max_concurrent_trials is None else check_count(spec.max_concurrent_trials,
                                                                               "--max-concurrent-trials")
    if concurrent > trials:
        raise JobSpecError(f"--max-concurrent-trials {concurrent} is more than --trials {trials}")
    if spec.sampler not in SAMPLERS:
        hint = " (tpe is Optuna's, for submit in-job-sweep)" if spec.sampler == "tpe" else ""
        raise JobSpecError(f"--sampler {spec.sampler!r}: Azure ML sweep jobs sample "
                           f"{', '.join(SAMPLERS)}{hint}")
    if spec.seed is not None:
        check_count(spec.seed, "--seed", least=0)
        if spec.sampler != "random":
            raise JobSpecError(f"--seed goes with --sampler random (Azure ML's {spec.sampler} sampling "
                               "takes none)")
    _check_sampler_space(spec.sampler, parameters, spec.early_termination)
    if spec.early_termination is not None:
        _check_early_termination(spec.early_termination)
    return SweepJob(space_file=space_file, parameters=parameters, metric=spec.metric.strip(),
                    goal=GOALS[spec.mode], sampler=spec.sampler, seed=spec.seed, max_total_trials=trials,
                    max_concurrent_trials=concurrent, early_termination=spec.early_termination,
                    trial_timeout=check_duration(spec.trial_timeout, "--trial-timeout"))


def _overridden(args: tuple[str, ...], searched: list[str], space_name: str) -> list[str]:
    """A warning for each `--set FIELD=...` of the script's own that every trial overrides (the trial's
    values come after the script's arguments, and the last --set wins)."""
    return [f"the script's argument --set {name} is overridden by the search space ({space_name}): every "
            f"trial sets {name}" for name in dict.fromkeys(script_args.set_fields(args)) if name in searched]


def search_parameters(space: SearchSpace) -> tuple[SearchParameter, ...]:
    """The space's parameters with Azure ML keys: letters, digits and '_' only (`extra.hidden` ->
    `extra_hidden`). Two names that would share a key are an error naming both."""
    keys: dict[str, str] = {}
    parameters = []
    for p in space.parameters:
        key = _NOT_IDENTIFIER.sub("_", p.name)
        if key in keys:
            raise JobSpecError(f"search space parameters {keys[key]!r} and {p.name!r} both become the Azure "
                               f"ML search space key {key!r} (letters, digits and '_' only): rename one")
        keys[key] = p.name
        parameters.append(SearchParameter(name=p.name, key=key, kind=p.kind, args=dict(p.args)))
    return tuple(parameters)


def _load_space(path: Path) -> SearchSpace:
    from hvdazure.sweep.space import SearchSpace, SpaceError

    try:
        return SearchSpace.from_yaml(path)
    except SpaceError as exc:
        raise JobSpecError(str(exc)) from None


def _check_sampler_space(sampler: str, parameters: tuple[SearchParameter, ...],
                         policy: EarlyTermination | None) -> None:
    allowed = {"grid": ("choice",), "bayesian": BAYESIAN_KINDS}.get(sampler)
    if allowed is None:
        return
    for p in parameters:
        if p.kind not in allowed:
            raise JobSpecError(f"--sampler {sampler}: Azure ML's {sampler} sampling takes "
                               f"{', '.join(allowed)} parameters only, and {p.name!r} is {p.describe()}")
    if sampler == "bayesian" and policy is not None:
        raise JobSpecError(f"--early-termination {policy.policy}: Azure ML's Bayesian sampling takes no "
                           "early termination policy (use --early-termination none, or --sampler random)")


def _check_early_termination(policy: EarlyTermination) -> None:
    if policy.policy not in POLICIES:
        raise JobSpecError(f"--early-termination {policy.policy!r}: expected none, {', '.join(POLICIES)}")
    check_count(policy.evaluation_interval, "--evaluation-interval")
    check_count(policy.delay_evaluation, "--delay-evaluation", least=0)
    if policy.policy == "bandit":
        factor = policy.slack_factor
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor > 0:
            raise JobSpecError(f"--slack-factor must be a number above 0 (0.1: within 10% of the best), got "
                               f"{factor!r}")
    if policy.policy == "truncation":
        percentage = check_count(policy.truncation_percentage, "--truncation-percentage")
        if percentage > 99:
            raise JobSpecError(f"--truncation-percentage must be 1 to 99, got {percentage}")


def _metric_warning(metric: str) -> list[str]:
    if metric.startswith(("eval_", "train_")) or metric == "lr":
        return []
    return [f"--metric {metric}: hvdazure's trainer logs eval_NAME and train_NAME to MLflow (e.g. "
            f"eval_{metric}); no trial reports this one unless the script logs it itself"]


def _in_job_sweep(spec: InJobSweepSpec, job: ResolvedJob, cwd: Path) -> ResolvedJob:
    """Checks the job's own `python -m hvdazure.sweep` would make, with its own code, before the upload;
    the job with the sweep as its kind."""
    from hvdazure.sweep.options import SweepOptions
    from hvdazure.sweep.space import SpaceError

    space_path = (cwd / spec.space).resolve()
    if not space_path.is_file():
        raise JobSpecError(f"--space {spec.space}: search space file not found")
    try:
        space = space_path.relative_to(job.code_dir).as_posix()
    except ValueError:
        raise JobSpecError(f"--space {spec.space} is outside the code directory {job.code_dir}: the job "
                           "reads it from the uploaded code, so put it there") from None
    if not job.snapshot.contains(space):
        ignore_file = job.code_dir / str(job.snapshot.ignore_file)
        raise JobSpecError(f"--space {space} is excluded by {ignore_file}: it would not be uploaded")
    trials = check_count(spec.trials, "--trials")
    ranks = check_count(spec.ranks_per_trial, "--ranks-per-trial")
    if job.world_size % ranks:
        raise JobSpecError(f"--ranks-per-trial {ranks} does not divide the job's {job.nodes} node(s) x "
                           f"{job.processes_per_node} process(es) = {job.world_size} ranks: every rank "
                           "must belong to a trial")
    check_count(spec.seed, "--seed", least=0)
    searched = _load_space(space_path)
    credential_check.check_search_space(searched)  # uploaded with the code
    local = SweepOptions(script=str(job.code_dir / job.script), space=str(space_path),
                         metric=spec.metric, trials=trials, ranks_per_trial=ranks, mode=spec.mode,
                         sampler=spec.sampler, pruner=spec.pruner, seed=spec.seed, output=IN_JOB_OUTPUT,
                         mlflow=True, script_args=job.script_args)  # trials: child runs of the job's run
    try:
        try:
            local.check()
        except ImportError:  # no Optuna here: the job checks its distributions, the grid is checked now
            if local.sampler == "grid":
                searched.grid()
    except SpaceError as exc:
        raise JobSpecError(str(exc)) from None
    warnings = (*job.warnings, *_overridden(job.script_args, [p.name for p in searched.parameters],
                                            space_path.name))
    return dataclasses.replace(job, kind=InJobSweep(options=dataclasses.replace(local, script=job.script,
                                                                                 space=space)),
                               warnings=warnings)
