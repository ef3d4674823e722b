"""An Azure ML sweep with the legacy SDK v1: a HyperDrive run (azureml-train-core's `HyperDriveConfig`).

The trial is the ScriptRunConfig run_config.py builds for the command job (MPI layout, Docker, environment),
with one difference. HyperDrive hands each trial its sampled values as script arguments appended after the
job's own (`--extra_hidden 64`), and a v1 ScriptRunConfig must run a script file (HyperDrive ignores its
arguments when the run is a `command`). So the trial's script is `hvdazure_hyperdrive.py`, a small
file at the top of the code directory that hands the real script `--set NAME=VALUE` (hyperdrive_args.py):
hvdazure writes it there for the upload and removes it after (one the user keeps there is used as it is).

The HyperDriveConfig holds the search: the parameter space under `--KEY` names (Azure ML's distributions,
parameter_expressions), the sampling (RandomParameterSampling with an optional seed, GridParameterSampling,
BayesianParameterSampling), the primary metric and its goal, max_total_runs, max_concurrent_runs,
max_duration_minutes and the early termination policy. HyperDrive has no timeout per trial: `--trial-timeout`
is the trial run's `max_run_duration_seconds`. A dry run writes its settings (what the HyperDrive service is
sent, less the workspace's addresses) and the trial's run configuration as YAML, and loads both back with
the SDKs; it prints the trial's command as v1 runs it (the entry file), not SDK v2's placeholders.

`HyperDriveRun` is how submit.py's V1Sdk sends a job of this kind (an Azure ML sweep job, `hvdazure submit
sweep ... --sdk v1`).
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdazure.azure import code_snapshot
from hvdazure.azure.errors import JobSpecError, SubmitError, redacted_line
from hvdazure.azure.hyperdrive_args import ENTRY_FILE, ENTRY_SOURCE, entry_arguments
from hvdazure.azure.resolved_job import CommandJob, ResolvedJob, SearchParameter, SweepJob
from hvdazure.azure.sdk import output_file
from hvdazure.azure.v1 import run_config as run_config_v1
from hvdazure.core.durations import as_units, describe
from hvdazure.sweep.space import KINDS

MAX_DURATION_MINUTES = 10080  # HyperDrive's own limit: 7 days
_SAMPLING = {"random": "RandomParameterSampling", "grid": "GridParameterSampling",
             "bayesian": "BayesianParameterSampling"}
_POLICIES = {"bandit": "BanditPolicy", "median": "MedianStoppingPolicy",
             "truncation": "TruncationSelectionPolicy"}


@dataclass(frozen=True)
class HyperDriveRun:
    """An Azure ML sweep job as SDK v1 sends it: a HyperDriveConfig around the trial's ScriptRunConfig."""

    job: ResolvedJob
    sweep: SweepJob
    also_checked = ", and azureml-train-core the HyperDriveConfig"  # for the dry run's report

    def check_supported(self) -> None:
        """What a HyperDrive run of this job would trip on, found before anything is uploaded."""
        job, sweep = self.job, self.sweep
        try:
            import azureml.train.hyperdrive  # noqa: F401
        except ImportError as exc:
            raise SubmitError(f"submit sweep with --sdk v1 needs azureml-train-core (HyperDrive): pip "
                              f"install 'azureml-train-core~=1.61.0' ({redacted_line(exc)})") from None
        if job.max_duration is not None and job.max_duration > MAX_DURATION_MINUTES * 60:
            raise JobSpecError(f"--max-duration {describe(job.max_duration)}: a HyperDrive run lasts at most "
                               f"{MAX_DURATION_MINUTES} minutes ({as_units(MAX_DURATION_MINUTES * 60)})")
        if code_snapshot.is_ignored(job.code_dir, ENTRY_FILE):
            ignore_file = job.code_dir / str(job.snapshot.ignore_file)
            raise JobSpecError(f"{ENTRY_FILE} is excluded by {ignore_file}, and an SDK v1 sweep's trials run "
                               f"it from the upload: let it through (!{ENTRY_FILE})")
        existing = job.code_dir / ENTRY_FILE
        if existing.exists() and (not existing.is_file() or existing.read_text() != ENTRY_SOURCE):
            raise JobSpecError(f"{existing} is not hvdazure's HyperDrive entry, and an SDK v1 sweep's trials "
                               "run a file of that name: rename yours")
        for p in sweep.parameters:
            parameter_expression(p)  # choice values HyperDrive refuses

    def trial(self) -> ResolvedJob:
        """The trial as a command job: the entry file, given the parameter keys, the script and its
        arguments, and the trial timeout as its max duration (HyperDrive has no timeout per trial)."""
        job = self.job
        params = {p.key: p.name for p in self.sweep.parameters}
        return dataclasses.replace(job, script=ENTRY_FILE, kind=CommandJob(),
                                   script_args=tuple(entry_arguments(params, job.script, job.script_args)),
                                   max_duration=self.sweep.trial_timeout, name=None, description=None)

    def build_config(self, workspace: Any = None) -> Any:
        """The HyperDriveConfig around the trial's ScriptRunConfig (`workspace`: see build_run_config)."""
        import azureml.core  # noqa: F401  (first: azureml.train.hyperdrive alone logs a spurious failure)
        from azureml.train import hyperdrive

        sweep = self.sweep
        space = {f"--{p.key}": parameter_expression(p) for p in sweep.parameters}
        properties = {"seed": sweep.seed} if sweep.seed is not None else None
        policy = sweep.early_termination
        duration = self.job.max_duration
        minutes = MAX_DURATION_MINUTES if duration is None else math.ceil(duration / 60)
        try:
            with warnings.catch_warnings():  # its advice on Bayesian run counts; hvdazure prints the job
                warnings.simplefilter("ignore")
                return hyperdrive.HyperDriveConfig(
                    run_config=run_config_v1.build_run_config(self.trial(), workspace),
                    hyperparameter_sampling=getattr(hyperdrive, _SAMPLING[sweep.sampler])(space, properties),
                    primary_metric_name=sweep.metric,
                    primary_metric_goal=hyperdrive.PrimaryMetricGoal.from_str(sweep.goal),
                    max_total_runs=sweep.max_total_trials,
                    max_concurrent_runs=sweep.max_concurrent_trials,
                    max_duration_minutes=minutes, custom_run_id=self.job.name,
                    policy=None if policy is None else getattr(hyperdrive, _POLICIES[policy.policy])(
                        evaluation_interval=policy.evaluation_interval,
                        delay_evaluation=policy.delay_evaluation,
                        **({"slack_factor": policy.slack_factor} if policy.policy == "bandit" else {}),
                        **({"truncation_percentage": policy.truncation_percentage}
                           if policy.policy == "truncation" else {})))
        except hyperdrive.exceptions.HyperDriveConfigException as exc:
            raise JobSpecError(f"azureml-train-core refused the sweep: {_message(exc)}") from None

    def write_yaml(self, path: str | Path) -> list[Path]:
        """The HyperDrive settings and the trial's run configuration, as YAML."""
        import yaml

        path = output_file(path)
        config = self.build_config()
        data = {**run_config_v1.run_fields(self.job), "hyperdrive": settings(config),
                "run_configuration": run_config_v1.run_configuration(self.job, config.run_config)}
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return [path]

    def validate_offline(self, files: list[Path]) -> dict[str, Any]:
        """Load the file back: the run configuration with azureml-core (checked as a command job's), then a
        HyperDriveConfig from the sampling and policy as written, whose settings must be those written."""
        import yaml
        from azureml.core import ScriptRunConfig
        from azureml.core.runconfig import RunConfiguration
        from azureml.train.hyperdrive import HyperDriveConfig, PrimaryMetricGoal
        from azureml.train.hyperdrive.policy import _policy_from_dict
        from azureml.train.hyperdrive.sampling import _sampling_from_dict

        (path,) = files
        data = yaml.safe_load(path.read_text())
        written, run_data = data["hyperdrive"], data["run_configuration"]
        run_config_v1.check_run_fields(self.job, data, path.name)
        found = run_config_v1.check_run_configuration(self.trial(), run_data, path.name)
        try:
            sampling = _sampling_from_dict(written["generator_config"])
            sampling._properties = written["generator_config"].get("properties")  # its _from_dict drops them
            policy = written["policy_config"]
            run_config = RunConfiguration._get_runconfig_using_dict(
                {k: v for k, v in run_data.items() if k != "sourceDirectory"})
            loaded = HyperDriveConfig(
                run_config=ScriptRunConfig(str(self.job.code_dir), run_config=run_config),
                hyperparameter_sampling=sampling,
                primary_metric_name=written["primary_metric_config"]["name"],
                primary_metric_goal=PrimaryMetricGoal.from_str(written["primary_metric_config"]["goal"]),
                max_total_runs=written["max_total_jobs"], max_concurrent_runs=written["max_concurrent_jobs"],
                max_duration_minutes=written["max_duration_minutes"],
                policy=None if policy["name"] == "Default" else _policy_from_dict(policy))
        except Exception as exc:
            raise SubmitError(f"azureml-train-core cannot load {path.name} back: {_message(exc)}") from None
        if settings(loaded) != written:
            raise SubmitError(f"{path.name} does not load back as written: {settings(loaded)} != {written}")
        return {**found, "hyperdrive": written}

    def submit_arguments(self) -> dict[str, Any]:
        """Experiment.submit's arguments beyond the configuration: none (the run's id is the config's)."""
        return {}

    def notes(self, body: dict[str, Any]) -> tuple[str, ...]:
        """How HyperDrive's trials get their values, after the command that `command` prints."""
        return (f"HyperDrive appends each sampled value to that command as --KEY VALUE, which {ENTRY_FILE} "
                f"hands {self.job.script} as --set NAME=VALUE",)

    def command(self) -> str:
        """What each trial runs: the entry file, not the job's command with SDK v2's placeholders."""
        return shlex.join(self.trial().argv)

    @contextmanager
    def run_config(self, workspace: Any) -> Iterator[Any]:
        """The HyperDriveConfig to submit, with the entry file in the snapshot that Experiment.submit
        uploads."""
        with entry_file(self.job.code_dir):
            yield self.build_config(workspace)


def parameter_expression(p: SearchParameter) -> list[Any]:
    """HyperDrive's expression for one parameter (parameter_expressions.choice, uniform, ...); choice values
    must be numbers or strings, all strings or none, as HyperDrive checks them."""
    import azureml.core  # noqa: F401
    from azureml.train.hyperdrive import parameter_expressions
    from azureml.train.hyperdrive.exceptions import HyperDriveConfigException
    from azureml.train.hyperdrive.sampling import HyperParameterSampling

    why: str | None
    try:
        expression = getattr(parameter_expressions, p.kind)(*(p.args[name] for name in KINDS[p.kind]))
    except HyperDriveConfigException as exc:  # e.g. a q that is not a whole number
        why = _message(exc)
    else:
        ok, why = HyperParameterSampling._choice_validator(expression) if p.kind == "choice" else (True, None)
        if ok:
            return expression
    raise JobSpecError(f"search space parameter {p.name!r}: {p.describe()}: {why} (HyperDrive, SDK v1)")


def settings(config: Any) -> dict[str, Any]:
    """What HyperDrive's service is sent for the search (CreateExperimentDto's fields, through its models),
    less the platform configuration, which needs the workspace."""
    from azureml.train.restclients.hyperdrive import models

    return {
        "generator_config": models.CreateExperimentDtoGeneratorConfig.from_dict(config._generator_config)
        .serialize(),
        "policy_config": models.CreateExperimentDtoPolicyConfig.from_dict(config._policy_config).serialize(),
        "primary_metric_config": models.CreateExperimentDtoPrimaryMetricConfig.from_dict(
            config._primary_metric_config).serialize(),
        "max_total_jobs": config._max_total_runs,
        "max_concurrent_jobs": config._max_concurrent_runs,
        "max_duration_minutes": config._max_duration_minutes,
        "platform": config._platform,
    }


@contextmanager
def entry_file(code_dir: Path) -> Iterator[Path]:
    """The trials' entry file at the top of `code_dir` while the snapshot is taken: written if absent and
    removed after; one with hvdazure's content is left as it is (check_supported refused any other)."""
    path = code_dir / ENTRY_FILE
    if path.exists():
        yield path
        return
    path.write_text(ENTRY_SOURCE)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _message(exc: Exception) -> str:
    """azureml's exceptions carry the message in `.message`; their str() starts with the class name."""
    message = getattr(exc, "message", None)
    if isinstance(message, str) and message.strip():
        return message.strip().splitlines()[0]
    return redacted_line(exc)
