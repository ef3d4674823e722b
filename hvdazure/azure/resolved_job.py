"""A job `hvdazure submit` validated offline (`ResolvedJob`), and its kind, decided once: what both SDKs'
SDKs submit. Data only; no Azure SDK here, and no import of the modules that validate (spec/job.py,
spec/sweep.py) or submit (v1/submit.py, v2/submit.py) it.

The kind says what the job's ranks run, and each SDK dispatches on it once:

- `CommandJob`: every rank runs `python SCRIPT ARGS` (plain `hvdazure submit`);
- `SweepJob`: an Azure ML sweep job (SDK v1: a HyperDrive run) whose trials are that command job, given the
  sampled values as `--set NAME=VALUE` (`hvdazure submit sweep`);
- `InJobSweep`: one command job whose ranks all run `python -m hvdazure.sweep` (`hvdazure submit
  in-job-sweep`).
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hvdazure._version import __version__
from hvdazure.azure.code_snapshot import CodeSnapshot
from hvdazure.core.durations import describe

if TYPE_CHECKING:
    from hvdazure.sweep.options import SweepOptions

GOALS = {"min": "minimize", "max": "maximize"}
VERSION_TAG = "hvdazure"  # the tag that records the hvdazure version of a submission (jobs show reads it)
SERVERLESS = "serverless"  # `--compute serverless`: Azure ML's serverless compute (azure-ai-ml's name)
MODEL_TYPES = ("mlflow_model", "custom_model")  # an output of these types is registered as a model


@dataclass(frozen=True)
class InputSpec:
    """A job input: an Azure ML data asset (`azureml:NAME@latest`, `azureml:NAME:VERSION`), a datastore path
    (`azureml://datastores/...`), a storage URL without credentials, or a local path (uploaded)."""

    name: str
    uri: str
    type: str = "uri_folder"
    mode: str = "ro_mount"


@dataclass(frozen=True)
class OutputSpec:
    """A job output; without a URI, Azure ML picks a place in the workspace's default datastore. With an
    `asset_name`, Azure ML registers what the job wrote as that asset (a model for the model types, else a
    data asset), as `asset_version` or the asset's next version."""

    name: str
    uri: str | None = None
    type: str = "uri_folder"
    mode: str = "rw_mount"
    asset_name: str | None = None
    asset_version: str | None = None

    def describe(self) -> str:
        registered = ""
        if self.asset_name is not None:
            kind = "model" if self.type in MODEL_TYPES else "data asset"
            version = f"version {self.asset_version}" if self.asset_version else "its next version"
            registered = f", registered as {kind} {self.asset_name}, {version}"
        return f"{self.type} {self.uri or '(default datastore)'} ({self.mode}{registered})"

    def as_dict(self) -> dict[str, str | None]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class JobEnvironment:
    """The Azure ML environment the job runs in. Ours are named and versioned by content, so a second
    submission with the same image (and conda file) reuses the registered environment."""

    name: str
    version: str | None  # None for `@latest` of a registered environment
    image: str | None = None
    conda_file: Path | None = None
    registered: bool = False  # True: the user's own, referenced and never created
    registry: str | None = None  # a registry's (Azure ML's curated ones: "azureml"), not the workspace's

    @property
    def reference(self) -> str:
        """How a job names it: `azureml:NAME:VERSION` / `azureml:NAME@latest`, or a registry's URI."""
        if self.registry is not None:
            which = "labels/latest" if self.version is None else f"versions/{self.version}"
            return f"azureml://registries/{self.registry}/environments/{self.name}/{which}"
        which = "@latest" if self.version is None else f":{self.version}"
        return f"azureml:{self.name}{which}"


@dataclass(frozen=True)
class QueueSettings:
    """Where a job on serverless compute queues (spec/settings.py): its job tier (spot or standard) and its
    priority within the tier (low, medium or high); None: Azure ML's default."""

    job_tier: str | None = None
    priority: str | None = None

    def describe(self) -> str:
        return ", ".join(f"{what} {value}" for what, value in (("job tier", self.job_tier),
                                                               ("priority", self.priority)) if value)


@dataclass(frozen=True)
class JobIdentity:
    """The identity the job runs as (spec/identity.py says what each reaches): the submitting user's, or a
    managed identity of the compute, user-assigned when `client_id` is given."""

    kind: str  # "user" or "managed"
    client_id: str | None = None

    def describe(self) -> str:
        if self.kind == "user":
            return "user (the submitting user's, for the job's inputs and outputs)"
        which = f"user-assigned, client id {self.client_id}" if self.client_id else "system-assigned"
        return f"managed ({which}), also DefaultAzureCredential's in the job"

    def as_dict(self) -> dict[str, str | None]:
        return {"type": self.kind, "client_id": self.client_id}


@dataclass(frozen=True)
class ResumeSource:
    """What `--resume-from` wires in (resume_from.py): job `job`'s checkpoints (`where`, in words), read
    through `input` (None: a URL the new job reads itself), and the script arguments `--set resume=auto
    --set resume_from=SETTING`.
    `looked_up`: where they are was read from the job in the workspace (a submission), not assumed from the
    new job's own command (a dry run)."""

    job: str
    where: str
    setting: str
    input: InputSpec | None
    looked_up: bool

    def settings(self) -> list[str]:
        """The config settings the script gets, each after a --set: auto, which finds none of the new job's
        own at its first start and goes on from job `job`'s (resume_from), and its own when Azure ML runs
        it again."""
        return ["resume=auto", f"resume_from={self.setting}"]

    def describe(self) -> list[str]:
        through = f", read through input {self.input.name}" if self.input else ""
        settings = " ".join(f"--set {s}" for s in self.settings())
        lines = [f"resume: job {self.job}'s newest valid checkpoint in {self.where}{through}, with "
                 f"{settings} "
                 "(the new job writes its own checkpoints and, run again by Azure ML, goes on from those; "
                 "the run goes on)"]
        if not self.looked_up:
            lines.append(f"job {self.job} not looked up (a dry run has no workspace): where its checkpoints "
                         "are is assumed from this job's command; a submission reads it from job "
                         f"{self.job}'s, and refuses a job that is missing, not ended, a sweep or keeps no "
                         "checkpoints, before any upload")
        return lines

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "checkpoints": self.where, "settings": self.settings(),
                "input": dataclasses.asdict(self.input) if self.input else None, "looked_up": self.looked_up}


# --- the job's kind ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CommandJob:
    """Every rank runs the script with its arguments: the job plain `hvdazure submit` makes."""

    def rank_argv(self, job: ResolvedJob) -> tuple[str, ...]:
        return ("python", job.script, *job.script_args)

    def summary(self, job: ResolvedJob) -> list[str]:
        return []

    def json_fields(self) -> dict[str, Any]:
        return {}

    def nodes_at_once(self, job: ResolvedJob) -> int:
        return job.nodes


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
class SweepJob:
    """An Azure ML sweep job, validated: what SDK v2's SweepJob and SDK v1's HyperDriveConfig are built from.
    Its trials are the job's command job."""

    space_file: Path
    parameters: tuple[SearchParameter, ...]
    metric: str
    goal: str  # minimize or maximize
    sampler: str
    seed: int | None
    max_total_trials: int
    max_concurrent_trials: int
    early_termination: EarlyTermination | None
    trial_timeout: int | None = None  # seconds per trial (the whole sweep job's: ResolvedJob.max_duration)

    def rank_argv(self, job: ResolvedJob) -> tuple[str, ...]:
        """A trial's command (SDK v2): the script, then each sampled value as `--set NAME=VALUE`, which Azure
        ML writes in place of `${{search_space.KEY}}`."""
        sampled = [arg for p in self.parameters
                   for arg in ("--set", f"{p.name}=${{{{search_space.{p.key}}}}}")]
        return ("python", job.script, *job.script_args, *sampled)

    def summary(self, job: ResolvedJob) -> list[str]:
        seed = f" (seed {self.seed})" if self.seed is not None else ""
        policy = self.early_termination.describe() if self.early_termination else "none"
        limit = f"; each trial stops after {describe(self.trial_timeout)}" if self.trial_timeout else ""
        parameters = "; ".join(f"{p.name} {p.describe()}" + (f" as {p.key}" if p.key != p.name else "")
                               for p in self.parameters)
        return [f"sweep job: {self.max_total_trials} trial(s) of {job.nodes} node(s) x "
                f"{job.processes_per_node} process(es), up to {self.max_concurrent_trials} at once; "
                f"{self.sampler} sampling{seed}; objective: {self.goal} {self.metric} (the MLflow metric "
                "every trial logs)",
                f"early termination: {policy}{limit}",
                f"search space ({self.space_file.name}): {parameters}"]

    def json_fields(self) -> dict[str, Any]:
        policy = self.early_termination
        return {"sweep": {
            "type": "sweep_job", "metric": self.metric, "goal": self.goal, "sampler": self.sampler,
            "seed": self.seed, "max_total_trials": self.max_total_trials,
            "max_concurrent_trials": self.max_concurrent_trials, "trial_timeout": self.trial_timeout,
            "early_termination": dataclasses.asdict(policy) if policy else None,
            "search_space": {p.key: {"name": p.name, "type": p.kind, **p.args} for p in self.parameters}}}

    def nodes_at_once(self, job: ResolvedJob) -> int:
        """Every concurrent trial holds the nodes of one command job."""
        return job.nodes * self.max_concurrent_trials


@dataclass(frozen=True)
class InJobSweep:
    """A sweep inside one command job, validated: the options every rank's `python -m hvdazure.sweep` gets
    (paths relative to the code directory, where the job starts)."""

    options: SweepOptions

    def rank_argv(self, job: ResolvedJob) -> tuple[str, ...]:
        from hvdazure.sweep.options import per_rank_command

        return tuple(per_rank_command(self.options, "python"))

    def summary(self, job: ResolvedJob) -> list[str]:
        o = self.options
        return [f"in-job sweep: {o.trials} trial(s) of {o.ranks_per_trial} rank(s), "
                f"{job.world_size // o.ranks_per_trial} at once on the job's {job.world_size} ranks; "
                f"{o.sampler} sampler, pruner {o.pruner}, seed {o.seed}; objective: {GOALS[o.mode]} "
                f"{o.metric}; results in {o.output}"]

    def json_fields(self) -> dict[str, Any]:
        return {"sweep": {"type": "in_job", **self.options.to_dict()}}

    def nodes_at_once(self, job: ResolvedJob) -> int:
        return job.nodes


JobKind = CommandJob | SweepJob | InJobSweep


# --- the job ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResolvedJob:
    """A job validated offline, every default filled in: what will be uploaded and submitted, in the terms of
    both SDKs. Made by spec.job.resolve from a JobSpec."""

    code_dir: Path
    script: str  # relative to code_dir, POSIX separators
    script_args: tuple[str, ...]
    compute: str
    nodes: int
    processes_per_node: int
    environment: JobEnvironment
    env: dict[str, str]
    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]
    experiment: str
    display_name: str
    tags: dict[str, str]
    shm_size: str | None
    docker_args: str | None
    vm_size: str | None
    snapshot: CodeSnapshot
    warnings: tuple[str, ...] = ()
    kind: JobKind = CommandJob()
    identity: JobIdentity | None = None  # None: Azure ML's default (an AML token)
    name: str | None = None  # the job's name, its id in the workspace; None: Azure ML names it
    description: str | None = None
    max_duration: int | None = None  # seconds, after which Azure ML cancels the job (a sweep job: all of it)
    queue: QueueSettings | None = None  # serverless compute's job tier and priority
    resume: ResumeSource | None = None  # --resume-from: its input is among `inputs`, its setting in the args

    @property
    def serverless(self) -> bool:
        """True on Azure ML's serverless compute: no cluster of ours, the VM size asked for (`vm_size`)."""
        return self.compute == SERVERLESS

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes_per_node

    @property
    def argv(self) -> tuple[str, ...]:
        """What every rank runs (a sweep job's trial with `${{search_space.KEY}}` for the sampled values)."""
        return self.kind.rank_argv(self)

    @property
    def nodes_at_once(self) -> int:
        """The nodes the job holds at its busiest: what a cluster created for it must allow."""
        return self.kind.nodes_at_once(self)

    @property
    def command(self) -> str:
        """The job's command line; `${{inputs.x}}` placeholders stay as Azure ML substitutes them."""
        return shlex.join(self.argv)

    @property
    def submitted_tags(self) -> dict[str, str]:
        """The tags the job is submitted with: the user's, and the hvdazure version that submitted it."""
        return {VERSION_TAG: __version__, **self.tags}

    def summary(self, command: str | None = None) -> list[str]:
        """What a person checks before spending GPU hours, one fact per line (no secrets: see spec/job.py).
        `command`: what the SDK runs, where that is not `self.command` (an SDK v1 sweep's trial)."""
        environment = self.environment
        on = "serverless compute" if self.serverless else f"compute {self.compute}"
        lines = [
            f"MPI layout: {self.nodes} node(s) x {self.processes_per_node} process(es) = world size "
            f"{self.world_size}, on {on}" + (f" ({self.vm_size})" if self.vm_size else ""),
            f"environment: {environment.reference}"
            + (f" (image {environment.image})" if environment.image else "")
            + (f" + conda file {environment.conda_file.name}" if environment.conda_file else ""),
            f"command: {command or self.command}",
            f"code: {self.code_dir} ({len(self.snapshot.files)} files, "
            f"{self.snapshot.total_bytes / 2**20:.1f} MB)",
            f"experiment: {self.experiment}; display name: {self.display_name}"
            + (f"; name: {self.name}" if self.name else ""),
        ]
        if self.description:
            lines.append(f"description: {self.description}")
        if self.max_duration:
            lines.append(f"max duration: {describe(self.max_duration)}, then Azure ML cancels the job")
        if self.queue:
            lines.append(f"queue: {self.queue.describe()}")
        if self.identity:
            lines.append(f"identity: {self.identity.describe()}")
        if self.docker_args:
            lines.append(f"docker arguments: {self.docker_args}")
        if self.env:
            lines.append("environment variables: "
                         + " ".join(f"{k}={v}" for k, v in sorted(self.env.items())))
        for spec in self.inputs:
            uploaded = ", uploaded when submitting" if Path(spec.uri).is_absolute() else ""  # a local path
            lines.append(f"input {spec.name}: {spec.type} {spec.uri} ({spec.mode}{uploaded})")
        for out in self.outputs:
            lines.append(f"output {out.name}: {out.describe()}")
        if self.resume:
            lines += self.resume.describe()
        return lines + self.kind.summary(self)
