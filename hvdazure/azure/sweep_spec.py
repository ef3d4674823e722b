"""Hyperparameter sweeps on Azure ML as `hvdazure submit` takes them, validated offline; no Azure SDK here.

One search space file (hvdazure/sweep/space.py, in Azure ML's distributions) and two ways to search it:

- `--sweep SPACE.yaml`: an Azure ML sweep job. Each trial is the MPI command job `hvdazure submit` builds
  (nodes x processes per node), started by Azure ML with sampled values, which reach the script as
  `--set NAME=VALUE`. Azure ML reads the objective from each trial's MLflow run, so the trial's command turns
  the trainer's MLflow logging on (`--set mlflow=true`; inside Azure ML it logs into the trial's own run).
  SDK v2's SweepJob (sweep_v2.py) and SDK v1's HyperDriveConfig (sweep_v1.py) are built from one SweepPlan.
- `--in-job-sweep SPACE.yaml`: one MPI command job whose ranks all run `python -m hvdazure.sweep` (Optuna,
  trials of --ranks-per-trial ranks on mpi4py sub-communicators): one allocation, trials packed onto its GPUs.

What Azure ML would refuse only after the upload, or not at all, is refused here in one line: search-space
keys must be identifiers (`extra.hidden` becomes the key `extra_hidden`; two names that become one key are an
error); grid sampling takes choice parameters only, Bayesian sampling choice, uniform and quniform and no
early termination; counts, percentages and factors out of range; an in-job sweep whose trials do not divide
the job's ranks.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hvdazure.azure.errors import JobSpecError
from hvdazure.azure.job_spec import JobPlan, check_count

if TYPE_CHECKING:
    from hvdazure.core.config import TrainConfig
    from hvdazure.sweep.options import SweepOptions
    from hvdazure.sweep.space import SearchSpace

SAMPLERS = ("random", "grid", "bayesian")  # Azure ML's; an in-job sweep has Optuna's (hvdazure.sweep.options)
POLICIES = ("bandit", "median", "truncation")
BAYESIAN_KINDS = ("choice", "uniform", "quniform")  # what Azure ML's Bayesian sampling accepts
GOALS = {"min": "minimize", "max": "maximize"}
IN_JOB_OUTPUT = "./outputs/sweep"  # Azure ML uploads ./outputs with the job
_NOT_IDENTIFIER = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True)
class EarlyTermination:
    """Azure ML's early termination policy. Every `evaluation_interval` reports of the metric, after the first
    `delay_evaluation`, it cancels the trials that are behind: bandit, those worse than the best by more than
    `slack_factor` (a ratio); median, those below the median of the trials' running averages; truncation, the
    worst `truncation_percentage` percent."""

    policy: str  # bandit, median or truncation
    evaluation_interval: int = 1
    delay_evaluation: int = 5
    slack_factor: float | None = None  # bandit only: 0.1 unless given
    truncation_percentage: int | None = None  # truncation only: 20 unless given

    def __post_init__(self) -> None:
        if self.policy == "bandit" and self.slack_factor is None:
            object.__setattr__(self, "slack_factor", 0.1)
        if self.policy == "truncation" and self.truncation_percentage is None:
            object.__setattr__(self, "truncation_percentage", 20)

    def describe(self) -> str:
        detail = {"bandit": f", slack factor {self.slack_factor}",
                  "truncation": f", worst {self.truncation_percentage}%"}.get(self.policy, "")
        return (f"{self.policy} (every {self.evaluation_interval} report(s) of the metric after the first "
                f"{self.delay_evaluation}{detail})")


@dataclass(frozen=True)
class SweepSpec:
    """`--sweep SPACE.yaml`: an Azure ML sweep job whose trials are the job's MPI command job."""

    space: str
    metric: str  # an MLflow metric every trial logs: hvdazure's trainer logs eval_NAME and train_NAME
    mode: str = "min"
    trials: int = 10
    max_concurrent_trials: int | None = None  # default: every trial (the cluster's size queues the rest)
    sampler: str = "random"
    seed: int | None = None  # random sampling only
    early_termination: EarlyTermination | None = None
    timeout: int | None = None  # seconds for the whole sweep; running trials are cancelled then


@dataclass(frozen=True)
class InJobSweepSpec:
    """`--in-job-sweep SPACE.yaml`: `hvdazure sweep` inside one MPI command job (the space file must be in the
    uploaded code directory)."""

    space: str
    metric: str  # a key of the trainer's history, e.g. eval_loss
    mode: str = "min"
    trials: int = 10
    ranks_per_trial: int = 1
    sampler: str = "tpe"
    pruner: str = "none"
    seed: int = 0


@dataclass(frozen=True)
class SearchParameter:
    """A searched setting (a TrainConfig field or `extra.NAME`), its Azure ML search-space key and its
    distribution (Azure ML's kind and arguments, as in the space file)."""

    name: str
    key: str
    kind: str
    args: Mapping[str, Any]

    def describe(self) -> str:
        if self.kind == "choice":
            return f"choice{list(self.args['values'])}"
        return f"{self.kind}({', '.join(f'{k}={v}' for k, v in self.args.items())})"


@dataclass(frozen=True)
class SweepPlan:
    """A validated Azure ML sweep job: what SDK v2's SweepJob and SDK v1's HyperDriveConfig are built from."""

    space_file: Path
    parameters: tuple[SearchParameter, ...]
    metric: str
    goal: str  # minimize or maximize
    sampler: str
    seed: int | None
    max_total_trials: int
    max_concurrent_trials: int
    early_termination: EarlyTermination | None
    timeout: int | None

    def rank_argv(self, plan: JobPlan) -> tuple[str, ...]:
        """A trial's command (SDK v2): the script, then each sampled value as `--set NAME=VALUE`, which Azure
        ML writes in place of `${{search_space.KEY}}`."""
        sampled = [arg for p in self.parameters
                   for arg in ("--set", f"{p.name}=${{{{search_space.{p.key}}}}}")]
        return ("python", plan.script, *plan.script_args, *sampled)

    def summary(self, plan: JobPlan) -> list[str]:
        seed = f" (seed {self.seed})" if self.seed is not None else ""
        policy = self.early_termination.describe() if self.early_termination else "none"
        limit = f"; the sweep stops after {self.timeout} s" if self.timeout else ""
        parameters = "; ".join(f"{p.name} {p.describe()}" + (f" as {p.key}" if p.key != p.name else "")
                               for p in self.parameters)
        return [f"sweep job: {self.max_total_trials} trial(s) of {plan.nodes} node(s) x "
                f"{plan.processes_per_node} process(es), up to {self.max_concurrent_trials} at once; "
                f"{self.sampler} sampling{seed}; objective: {self.goal} {self.metric} (the MLflow metric "
                "every trial logs)",
                f"early termination: {policy}{limit}",
                f"search space ({self.space_file.name}): {parameters}"]

    def as_dict(self) -> dict[str, Any]:
        policy = self.early_termination
        return {"type": "sweep_job", "metric": self.metric, "goal": self.goal, "sampler": self.sampler,
                "seed": self.seed, "max_total_trials": self.max_total_trials,
                "max_concurrent_trials": self.max_concurrent_trials, "timeout": self.timeout,
                "early_termination": dataclasses.asdict(policy) if policy else None,
                "search_space": {p.key: {"name": p.name, "type": p.kind, **p.args} for p in self.parameters}}


@dataclass(frozen=True)
class InJobSweepPlan:
    """A validated in-job sweep: the options every rank's `python -m hvdazure.sweep` gets (paths relative to
    the code directory, where the job starts)."""

    options: SweepOptions

    def rank_argv(self, plan: JobPlan) -> tuple[str, ...]:
        from hvdazure.sweep.options import per_rank_command

        return tuple(per_rank_command(self.options, "python"))

    def summary(self, plan: JobPlan) -> list[str]:
        o = self.options
        return [f"in-job sweep: {o.trials} trial(s) of {o.ranks_per_trial} rank(s), "
                f"{plan.world_size // o.ranks_per_trial} at once on the job's {plan.world_size} ranks; "
                f"{o.sampler} sampler, pruner {o.pruner}, seed {o.seed}; objective: {GOALS[o.mode]} "
                f"{o.metric}; results in {o.output}"]

    def as_dict(self) -> dict[str, Any]:
        return {"type": "in_job", **self.options.to_dict()}


def from_options(*, sweep: str | None = None, in_job_sweep: str | None = None, metric: str | None = None,
                 mode: str | None = None, trials: int | None = None, max_concurrent_trials: int | None = None,
                 sampler: str | None = None, seed: int | None = None, early_termination: str | None = None,
                 evaluation_interval: int | None = None, delay_evaluation: int | None = None,
                 slack_factor: float | None = None, truncation_percentage: int | None = None,
                 timeout: int | None = None, ranks_per_trial: int | None = None,
                 pruner: str | None = None) -> SweepSpec | InJobSweepSpec | None:
    """The sweep `hvdazure submit`'s options ask for (None: not given), or None for a plain command job. An
    option that does not go with the kind of sweep asked for is an error, not ignored."""
    options = {"--metric": metric, "--mode": mode, "--trials": trials, "--sampler": sampler, "--seed": seed,
               "--max-concurrent-trials": max_concurrent_trials, "--early-termination": early_termination,
               "--evaluation-interval": evaluation_interval, "--delay-evaluation": delay_evaluation,
               "--slack-factor": slack_factor, "--truncation-percentage": truncation_percentage,
               "--timeout": timeout, "--ranks-per-trial": ranks_per_trial, "--pruner": pruner}
    given = [option for option, value in options.items() if value is not None]
    if sweep is not None and in_job_sweep is not None:
        raise JobSpecError("--sweep and --in-job-sweep: give one (an Azure ML sweep job, or a sweep inside "
                           "one job)")
    if sweep is None and in_job_sweep is None:
        if given:
            raise JobSpecError(f"{given[0]} goes with --sweep SPACE.yaml or --in-job-sweep SPACE.yaml")
        return None
    kind = "--sweep" if sweep is not None else "--in-job-sweep"
    only = {"--sweep": {"--max-concurrent-trials", "--early-termination", "--evaluation-interval",
                        "--delay-evaluation", "--slack-factor", "--truncation-percentage", "--timeout"},
            "--in-job-sweep": {"--ranks-per-trial", "--pruner"}}
    for option in given:
        for owner, owned in only.items():
            if option in owned and owner != kind:
                raise JobSpecError(f"{option} goes with {owner}, not {kind}")
    if not metric:
        raise JobSpecError(f"--metric is required with {kind}: the metric every trial reports, e.g. "
                           "eval_loss")
    common = {"metric": metric, **({"mode": mode} if mode is not None else {}),
              **({"trials": trials} if trials is not None else {}),
              **({"sampler": sampler} if sampler is not None else {})}
    if in_job_sweep is not None:
        return InJobSweepSpec(space=in_job_sweep, **common, **({"seed": seed} if seed is not None else {}),
                              **({"ranks_per_trial": ranks_per_trial} if ranks_per_trial is not None else {}),
                              **({"pruner": pruner} if pruner is not None else {}))
    policy = _early_termination(early_termination, evaluation_interval, delay_evaluation, slack_factor,
                                truncation_percentage)
    return SweepSpec(space=sweep, **common, seed=seed, max_concurrent_trials=max_concurrent_trials,
                     early_termination=policy, timeout=timeout)


def _early_termination(policy: str | None, evaluation_interval: int | None, delay_evaluation: int | None,
                       slack_factor: float | None,
                       truncation_percentage: int | None) -> EarlyTermination | None:
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
    given = {"evaluation_interval": evaluation_interval, "delay_evaluation": delay_evaluation,
             "slack_factor": slack_factor, "truncation_percentage": truncation_percentage}
    return EarlyTermination(policy, **{name: value for name, value in given.items() if value is not None})


# --- resolution -------------------------------------------------------------------------------------------
def apply(sweep: SweepSpec | InJobSweepSpec, plan: JobPlan, *, config: TrainConfig | None,
          cwd: Path) -> JobPlan:
    """`plan` (the validated command job) turned into the sweep: raises JobSpecError naming what to change.
    `config` is the TrainConfig the script's own arguments give (None: they give none)."""
    if isinstance(sweep, InJobSweepSpec):
        return dataclasses.replace(plan, sweep=_in_job_sweep(sweep, plan, cwd))
    if not isinstance(sweep, SweepSpec):
        raise JobSpecError(f"sweep {sweep!r}: expected a SweepSpec or an InJobSweepSpec")
    sweep_plan = resolve_sweep(sweep, cwd)
    if config is not None and config.mlflow_tracking_uri:
        raise JobSpecError(f"the script's arguments set mlflow_tracking_uri, so trials would log "
                           f"{sweep_plan.metric} there and Azure ML's sweep would never see it: leave it "
                           "unset (inside Azure ML, MLflow logs into each trial's own run)")
    warnings = [*plan.warnings, *_metric_warning(sweep_plan.metric)]
    warnings += [f"--output {out.name} has a fixed URI: every trial of the sweep writes to {out.uri}"
                 for out in plan.outputs if out.uri]
    # Azure ML reads the objective from each trial's MLflow run: the trainer logs only with mlflow on
    return dataclasses.replace(plan, script_args=(*plan.script_args, "--set", "mlflow=true"),
                               sweep=sweep_plan, warnings=tuple(warnings))


def resolve_sweep(spec: SweepSpec, cwd: Path) -> SweepPlan:
    """Validate an Azure ML sweep (everything but the trial, which job_spec.resolve checks)."""
    space_file = cwd / spec.space
    if not space_file.is_file():
        raise JobSpecError(f"--sweep {spec.space}: search space file not found")
    space = _load_space(space_file)
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
        hint = " (tpe is Optuna's, for --in-job-sweep)" if spec.sampler == "tpe" else ""
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
    timeout = None if spec.timeout is None else check_count(spec.timeout, "--timeout")
    return SweepPlan(space_file=space_file, parameters=parameters, metric=spec.metric.strip(),
                     goal=GOALS[spec.mode], sampler=spec.sampler, seed=spec.seed, max_total_trials=trials,
                     max_concurrent_trials=concurrent, early_termination=spec.early_termination,
                     timeout=timeout)


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


def _in_job_sweep(spec: InJobSweepSpec, plan: JobPlan, cwd: Path) -> InJobSweepPlan:
    """Checks the job's own `python -m hvdazure.sweep` would make, with its own code, before the upload."""
    from hvdazure.sweep.options import SweepOptions
    from hvdazure.sweep.space import SpaceError

    space_path = (cwd / spec.space).resolve()
    if not space_path.is_file():
        raise JobSpecError(f"--in-job-sweep {spec.space}: search space file not found")
    try:
        space = space_path.relative_to(plan.code_dir).as_posix()
    except ValueError:
        raise JobSpecError(f"--in-job-sweep {spec.space} is outside the code directory {plan.code_dir}: the "
                           "job reads it from the uploaded code, so put it there") from None
    if not plan.snapshot.contains(space):
        ignore_file = plan.code_dir / str(plan.snapshot.ignore_file)
        raise JobSpecError(f"--in-job-sweep {space} is excluded by {ignore_file}: it would not be uploaded")
    trials = check_count(spec.trials, "--trials")
    ranks = check_count(spec.ranks_per_trial, "--ranks-per-trial")
    if plan.world_size % ranks:
        raise JobSpecError(f"--ranks-per-trial {ranks} does not divide the job's {plan.nodes} node(s) x "
                           f"{plan.processes_per_node} process(es) = {plan.world_size} ranks: every rank "
                           "must belong to a trial")
    check_count(spec.seed, "--seed", least=0)
    local = SweepOptions(script=str(plan.code_dir / plan.script), space=str(space_path),
                         metric=spec.metric, trials=trials, ranks_per_trial=ranks, mode=spec.mode,
                         sampler=spec.sampler, pruner=spec.pruner, seed=spec.seed, output=IN_JOB_OUTPUT,
                         mlflow=True, script_args=plan.script_args)  # trials: child runs of the job's run
    try:
        try:
            local.check()
        except ImportError:  # no Optuna here: the job checks its distributions, the grid is checked now
            if local.sampler == "grid":
                _load_space(space_path).grid()
    except SpaceError as exc:
        raise JobSpecError(str(exc)) from None
    return InJobSweepPlan(options=dataclasses.replace(local, script=plan.script, space=space))
