"""`hvdazure submit SCRIPT --resume-from NAME`: a new job that goes on with job NAME's training from its
newest valid checkpoint, on another number of nodes or another VM size (the trainer resumes at any world
size). No Azure SDK here; the job is looked up through `hvdazure jobs`' own client (the submitting SDK's
AzureSdk.jobs: SDK v2's, as SDK v1 refuses --resume-from offline).

Where job NAME keeps its checkpoints is read from its command, as `hvdazure jobs` reads it
(records/checkpoints.checkpoint_place: `--set checkpoint_dir=${{outputs.OUTPUT}}`, a URL, or by default its
./outputs/checkpoints), and wired into the new job:

- an output of job NAME, or its own files (./outputs, which Azure ML keeps as the job's output named
  `artifacts` in its URIs): a read-only input `resume_from`, `azureml://jobs/NAME/outputs/OUTPUT/paths/PATH/`
  (Azure ML's form for a path in a job's output), and the script argument
  `--set resume=auto --set resume_from=${{inputs.resume_from}}/latest`;
- a URL (`abfs://...`): no input; `--set resume=auto --set resume_from=URL/latest`, read with the new job's
  own identity.

`DIR/latest` is the newest checkpoint in DIR that verifies (core/checkpoint/store.py): one cut short or
damaged falls back to the one before, and a directory with none fails the new job at its start, on every
rank, in one line. The new job writes its own checkpoints where its own command says, never into job NAME's,
and keeps the run's id. `resume=auto` with `resume_from` (TrainConfig): the new job's own checkpoint_dir is
empty at its first start, so it goes on from job NAME's; when Azure ML runs the new job again (after a
preemption of its own), auto finds its own newer checkpoints and goes on from those, not from job NAME's
again. The script's own `--set resume=...` or `resume_from=...` would contradict the wiring, and is refused
(one rule, rather than one of the two silently winning).

A dry run has no workspace, so it cannot look job NAME up: it assumes the checkpoints are where the new job's
own command puts its checkpoints (or at the trainer's default, ./outputs/checkpoints, where those would not
outlive the job), and says so. A submission looks the job up first, after the sign-in and
before anything else in the workspace, and refuses in one line: a job that does not exist, a sweep job or
another kind that is not a command job (a sweep's trials are jobs of their own: resume one), an in-job sweep
(whose trials each keep their own checkpoints), a job that has not ended (it may still write checkpoints,
and would go on training beside the new one: cancel it first), and a job whose command names no checkpoint
directory that outlives it (an output it lacks, a path outside ./outputs, or no command at all).
SDK v1 jobs take no inputs in hvdazure, so `--resume-from` needs SDK v2 (v1/submit.py refuses it).
"""

from __future__ import annotations

import itertools
import posixpath
import shlex
from collections.abc import Sequence

from hvdazure.azure.errors import JobError, JobSpecError
from hvdazure.azure.records.checkpoints import (
    DEFAULT_IN_JOB,
    CheckpointPlace,
    checkpoint_place,
    command_checkpoint_place,
)
from hvdazure.azure.records.job import JobDetails
from hvdazure.azure.resolved_job import InputSpec, ResumeSource
from hvdazure.azure.script_args import set_fields, without_fields
from hvdazure.azure.sdk import JobsClient
from hvdazure.azure.spec import credential_check

RESUME_INPUT = "resume_from"  # the input the new job reads the checkpoints through
ARTIFACTS_OUTPUT = "artifacts"  # Azure ML's name, in azureml://jobs/... URIs, for a job's own files
_KEPT = "outputs"  # of a job's own files, Azure ML keeps ./outputs (and the logs)
_SWEEP_MODULE = "hvdazure.sweep"
_RESUME_FIELDS = ("resume", "resume_from")
# what resumes a job's checkpoints given by hand as the input NAME
_MANUAL_SETTINGS = "--set resume=auto --set resume_from='${{inputs.NAME}}/latest'"


def check_new_job(name: str, script_args: Sequence[str], input_names: Sequence[str], sweep: bool) -> None:
    """What the new job must not be or have with `--resume-from NAME`, refused offline (JobSpecError)."""
    if sweep:
        raise JobSpecError(f"--resume-from {name}: goes with a command job (hvdazure submit SCRIPT), not a "
                           "sweep: every trial would go on with the same run")
    if given := sorted(set(_RESUME_FIELDS) & set(set_fields([str(a) for a in script_args]))):
        raise JobSpecError(f"--resume-from {name} sets resume and resume_from itself (to job {name}'s newest "
                           f"valid checkpoint): drop the script's --set {given[0]}=...")
    if RESUME_INPUT in input_names:
        raise JobSpecError(f"--input {RESUME_INPUT}: the input --resume-from {name} reads job {name}'s "
                           "checkpoints through: name yours otherwise")


def assumed(name: str, script_args: Sequence[str]) -> ResumeSource:
    """A dry run's wiring (and a submission's until the job is looked up): job NAME's checkpoints assumed
    where the new job's arguments put its own, or at the trainer's default where those would not outlive
    the job."""
    place = command_checkpoint_place([str(a) for a in script_args])
    if not _outlives_the_job(place):
        place = CheckpointPlace("job files", DEFAULT_IN_JOB)
    return _wiring(name, place, "this job's command", looked_up=False)


def look_up(name: str, jobs: JobsClient) -> ResumeSource:
    """A submission's wiring: job NAME as the workspace has it (through `hvdazure jobs`' client of the
    submitting SDK), refused in one line (SubmitError) if it cannot be resumed."""
    try:
        job = jobs.details(name)
    except JobError as exc:  # not found
        raise JobError(f"--resume-from {name}: {exc}") from None
    return source_of(job)


def source_of(job: JobDetails) -> ResumeSource:
    """The wiring that resumes `job`; SubmitError (one line) for a job that cannot be resumed."""
    name = job.name
    if job.job_type is not None and job.job_type != "command":
        raise JobError(f"--resume-from {name}: job {name} is a {job.job_type} job, not a command job"
                       + _kind_hint(job.job_type))
    if _in_job_sweep(job.argv):
        raise JobError(f"--resume-from {name}: job {name} is an in-job sweep, whose trials each keep their "
                       "own checkpoints (outputs/sweep): pass one trial's as an --input, with -- "
                       f"{_MANUAL_SETTINGS}")
    if not job.ended:
        raise JobError(f"--resume-from {name}: job {name} is {job.status}: it may still write checkpoints, "
                       f"and would go on training beside the new job; cancel it first (hvdazure jobs cancel "
                       f"{name}) or wait until it ends")
    place = checkpoint_place(job)
    if place is None:
        raise JobError(f"--resume-from {name}: job {name}'s command is unknown, so is where it keeps its "
                       "checkpoints")
    output = place.where.partition("/")[0]
    if place.kind == "output" and output not in job.outputs:
        known = ", ".join(sorted(job.outputs)) or "none"
        raise JobError(f"--resume-from {name}: job {name}'s command puts its checkpoints in output {output}, "
                       f"which the job does not have (its outputs: {known})")
    return _wiring(name, place, f"job {name}'s command", looked_up=True)


def resume_command(job: JobDetails) -> str:
    """The command that resumes `job` on a cluster of any size: `hvdazure submit SCRIPT --compute C --nodes N
    --resume-from NAME ... -- ARGS`, its script arguments less any `--set resume=...` (which --resume-from
    refuses), `...` for the options the job record does not hold (environment, inputs, outputs). SubmitError
    saying why, for a job --resume-from refuses."""
    if job.sdk == "v1":
        raise JobError(f"job {job.name} is an SDK v1 run, and --resume-from looks jobs up with SDK v2: "
                       f"download its checkpoints (hvdazure jobs download {job.name} --sdk v1) and give them "
                       f"to a new job as an --input, with -- {_MANUAL_SETTINGS}")
    source_of(job)
    argv = job.argv
    script_given = len(argv) > 1 and argv[0].startswith("python") and not argv[1].startswith("-")
    script, args = (argv[1], _without_resume(argv[2:])) if script_given else ("SCRIPT", [])
    words = ["hvdazure", "submit", script, "--compute", job.compute or "COMPUTE"]
    if job.nodes is not None:
        words += ["--nodes", str(job.nodes)]
    command = shlex.join([*words, "--resume-from", job.name]) + " ..."
    return f"{command} -- {shlex.join(args)}" if args else command


def resume_arguments(source: ResumeSource) -> list[str]:
    """The script arguments the wiring adds."""
    return [word for setting in source.settings() for word in ("--set", setting)]


def _wiring(name: str, place: CheckpointPlace, whose: str, looked_up: bool) -> ResumeSource:
    """Where `place` is read from in the new job: an input of job NAME's output or files, or the URL."""
    if place.kind == "url":
        where = f"the checkpoint_dir of {whose}"
        credential_check.refuse_value(where, place.where, credential_check.KEY_VAULT)
        return ResumeSource(name, place.where, f"{place.where.rstrip('/')}/latest", None, looked_up)
    if not _outlives_the_job(place):
        raise JobError(f"--resume-from {name}: {whose} keeps checkpoints in {place.where} inside the "
                       "container, which Azure ML does not keep (only ./outputs and the outputs are): "
                       "nothing to resume from")
    # an output's name and the path in it; the job's own files are Azure ML's output `artifacts`
    output, _, below = place.where.partition("/") if place.kind == "output" else \
        (ARTIFACTS_OUTPUT, "", place.where)
    uri = f"azureml://jobs/{name}/outputs/{output}/paths/" + (posixpath.join(below, "") if below else "")
    spec = InputSpec(name=RESUME_INPUT, uri=uri)
    return ResumeSource(name, place.describe(), f"${{{{inputs.{RESUME_INPUT}}}}}/latest", spec, looked_up)


def _outlives_the_job(place: CheckpointPlace) -> bool:
    """An output or a URL, or among the job's files in ./outputs, which Azure ML keeps (the rest of the
    container goes with it)."""
    return place.kind != "job files" or place.where == _KEPT or place.where.startswith(_KEPT + "/")


def _kind_hint(job_type: str) -> str:
    if job_type == "sweep":
        return ": its trials are jobs of their own, each with its checkpoints; resume one by its name"
    if job_type == "pipeline":
        return ": resume the step that trained, by its own job name"
    return ""


def _in_job_sweep(argv: Sequence[str]) -> bool:
    return any(pair == ("-m", _SWEEP_MODULE) for pair in itertools.pairwise(argv))


def _without_resume(args: Sequence[str]) -> list[str]:
    """The script arguments less each `--set resume=...` and `--set resume_from=...` (either form)."""
    return without_fields(args, _RESUME_FIELDS)
