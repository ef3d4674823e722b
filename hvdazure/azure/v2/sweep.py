"""An Azure ML sweep job with SDK v2 (azure-ai-ml): `hvdazure submit sweep SCRIPT --space SPACE.yaml`.

The sweep job's trial is the MPI command job submit.py builds (code, command, environment, resources with
the node count, `MpiDistribution(process_count_per_instance=N)`), and the job around it holds what every
trial shares: compute, inputs and outputs, experiment, names and tags, and the search: search space,
objective, sampling algorithm, limits and early termination policy. The trial's command passes each sampled
value as `--set NAME=${{search_space.KEY}}`, which Azure ML fills in per trial.

azure-ai-ml checks a sweep job's `${{inputs.x}}` references, but not its `${{search_space.x}}` ones: a key the
search space lacks would reach the script as the literal text. `check_body` checks both ways.

`SweepJobForm` is how submit.py's V2Sdk sends a job of this kind: it wraps the command job as the trial.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hvdazure.azure.errors import SubmitError
from hvdazure.azure.resolved_job import SearchParameter, SweepJob

SCHEMA = "https://azuremlschemas.azureedge.net/latest/sweepJob.schema.json"
YAML_ORDER = ("type", "name", "display_name", "description", "experiment_name", "compute", "trial",
              "search_space", "objective", "sampling_algorithm", "limits", "early_termination",
              "queue_settings", "inputs", "outputs", "tags")
_SEARCH_SPACE_REFERENCE = re.compile(r"\$\{\{\s*search_space\.([^}\s]+)\s*\}\}")


@dataclass(frozen=True)
class SweepJobForm:
    """A sweep job as SDK v2 sends it: the command job as its trial, what the trials share around it."""

    sweep: SweepJob
    max_duration: int | None  # the whole sweep job's timeout
    schema: str = SCHEMA
    yaml_order: tuple[str, ...] = YAML_ORDER
    trial_key: str | None = "trial"  # where the command, code and layout are

    def build(self, command_fields: dict[str, Any], shared_fields: dict[str, Any]) -> Any:
        from azure.ai.ml import entities

        return build(self.sweep, entities.CommandJob(**command_fields), self.max_duration, **shared_fields)

    def check_body(self, body: dict[str, Any], job_file: str) -> None:
        check_body(body, self.sweep, job_file)


def build(sweep: SweepJob, trial: Any, max_duration: int | None, **job_fields: Any) -> Any:
    """The SweepJob: `trial` is the command job each trial runs, `max_duration` the whole job's timeout,
    `job_fields` what the trials share (compute, inputs, outputs, names, tags, queue settings)."""
    from azure.ai.ml.sweep import Objective, SweepJob, SweepJobLimits

    return SweepJob(
        trial=trial,
        search_space=search_space(sweep.parameters),
        objective=Objective(goal=sweep.goal, primary_metric=sweep.metric),
        sampling_algorithm=_sampling_algorithm(sweep),
        limits=SweepJobLimits(max_total_trials=sweep.max_total_trials,
                              max_concurrent_trials=sweep.max_concurrent_trials,
                              timeout=max_duration, trial_timeout=sweep.trial_timeout),
        early_termination=_early_termination(sweep),
        **job_fields,
    )


def search_space(parameters: tuple[SearchParameter, ...]) -> dict[str, Any]:
    """azure.ai.ml.sweep's distributions by search-space key (arguments named as in the space file)."""
    from azure.ai.ml import sweep

    classes = {"choice": sweep.Choice, "randint": sweep.Randint, "uniform": sweep.Uniform,
               "quniform": sweep.QUniform, "loguniform": sweep.LogUniform, "qloguniform": sweep.QLogUniform,
               "normal": sweep.Normal, "qnormal": sweep.QNormal, "lognormal": sweep.LogNormal,
               "qlognormal": sweep.QLogNormal}
    return {p.key: classes[p.kind](**p.args) for p in parameters}


def check_body(body: dict[str, Any], sweep: SweepJob, job_file: str) -> None:
    """The REST body says what the sweep says: every `${{search_space.KEY}}` in the trial's command is a key
    of the search space and every key is passed, and the objective, limits and sampling survived the
    round trip."""
    referenced = set(_SEARCH_SPACE_REFERENCE.findall(body["trial"]["command"]))
    defined = set(body.get("searchSpace") or {})
    if referenced - defined:
        key = sorted(referenced - defined)[0]
        raise SubmitError(f"{job_file}: the trial's command uses ${{{{search_space.{key}}}}}, which the "
                          "search space does not define")
    if defined - referenced:
        raise SubmitError(f"{job_file}: search space key {sorted(defined - referenced)[0]} is never passed "
                          "to the script")
    found = (body.get("objective"), (body.get("limits") or {}).get("maxTotalTrials"),
             (body.get("samplingAlgorithm") or {}).get("samplingAlgorithmType"))
    wanted = ({"goal": sweep.goal, "primaryMetric": sweep.metric}, sweep.max_total_trials,
              sweep.sampler.capitalize())
    if found != wanted:
        raise SubmitError(f"{job_file} does not load back as written: {found} != {wanted}")


def _sampling_algorithm(sweep: SweepJob) -> Any:
    from azure.ai.ml.sweep import BayesianSamplingAlgorithm, GridSamplingAlgorithm, RandomSamplingAlgorithm

    if sweep.sampler == "random":
        return RandomSamplingAlgorithm(seed=sweep.seed)
    return {"grid": GridSamplingAlgorithm, "bayesian": BayesianSamplingAlgorithm}[sweep.sampler]()


def _early_termination(sweep: SweepJob) -> Any:
    from azure.ai.ml.sweep import BanditPolicy, MedianStoppingPolicy, TruncationSelectionPolicy

    policy = sweep.early_termination
    if policy is None:
        return None
    when = {"evaluation_interval": policy.evaluation_interval, "delay_evaluation": policy.delay_evaluation}
    if policy.policy == "bandit":
        return BanditPolicy(slack_factor=policy.slack_factor, **when)
    if policy.policy == "median":
        return MedianStoppingPolicy(**when)
    return TruncationSelectionPolicy(truncation_percentage=policy.truncation_percentage, **when)
