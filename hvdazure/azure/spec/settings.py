"""A job's own settings beyond what it runs: its name and description, how long it may run, and how it
queues; checked offline, each as one line naming the value. No Azure SDK here.

- `--name`: the job's name, which is its id in the workspace, so a script can refer to a job before it
  exists (`az ml job show -n NAME`). Azure ML's run history takes 1 to 256 letters, digits, '_' and '-',
  starting with a letter or digit (the runId pattern of azure-ai-ml's run history client,
  `^[a-zA-Z0-9][\\w-]{0,255}$`, here in ASCII); names are case-sensitive and unique in the workspace, which a
  submission with SDK v2 checks before anything is uploaded. SDK v1: the run's id (a HyperDrive run's
  custom run id).
- `--description`: text shown with the job (SDK v1: set on the run once it is created).
- `--max-duration DURATION`: Azure ML cancels the job after this long, given in seconds or with units
  (`2h`, `1h30m`: core/durations.py) and sent in whole seconds. A command job's (an in-job sweep's)
  `limits.timeout`, SDK v1 the run's `max_run_duration_seconds`; a sweep job's own timeout, its running
  trials cancelled with it (SDK v1: HyperDrive's max_duration_minutes). At least 60, as `--trial-timeout`:
  the service reads a shorter duration as days (azure-ai-ml's comment on its own floor, which it applies to
  sweep limits only, raising them to 60 s; a command job's it sends as it is).
- `--job-tier`, `--priority`: Azure ML's queue settings (`queue_settings` of command and sweep jobs, SDK v2
  only: azureml-core has none), for serverless compute (`--compute serverless`, sized by `--vm-size`): job
  tier spot (preemptible VMs at a lower price) or standard (dedicated VMs, the default); priority low,
  medium or high, the scheduling priority within the tier. A compute cluster's VMs are dedicated or low
  priority as the cluster was created (`hvdazure azure compute create --low-priority`), so neither is taken
  with one. azure-ai-ml also takes the tiers basic and premium: those of Singularity virtual clusters,
  which hvdazure does not submit to.

Serverless compute is sent as a job without a compute, which Azure ML documents as running a command or
sweep job on serverless compute, and the VM size as `resources.instance_type`: azure-ai-ml 1.35.2 would
send `compute: serverless` on as the ARM id of a compute cluster named serverless (only a pipeline's
default compute is special-cased).
"""

from __future__ import annotations

import re

from hvdazure.azure.errors import JobSpecError
from hvdazure.azure.resolved_job import SERVERLESS, QueueSettings
from hvdazure.core.durations import DurationError, parse_whole_seconds

JOB_TIERS = ("spot", "standard")  # serverless compute's; azure-ai-ml's JobTierNames also has basic, premium
PRIORITIES = ("low", "medium", "high")  # azure-ai-ml's JobPriorityValues
LEAST_DURATION = 60  # seconds: the service reads a shorter duration as days
_JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,255}$")
_SINGULARITY_TIERS = ("basic", "premium")


def check_job_name(name: str | None, option: str = "--name") -> str | None:
    """`--name` (or `option`, another that names a job) as Azure ML takes a job's name (None: none)."""
    if name is None:
        return None
    if not isinstance(name, str) or not _JOB_NAME.match(name):
        raise JobSpecError(f"{option} {name!r}: 1 to 256 letters, digits, '_' and '-', starting with a "
                           "letter or digit (Azure ML's job names)")
    return name


def check_duration(given: str | int | None, option: str) -> int | None:
    """A duration Azure ML ends a job or trial after (`2h`, `1h30m`, `5400`: core/durations.py), in whole
    seconds of at least a minute, as the SDKs take it (None: none). A refusal shows the value as given."""
    if given is None:
        return None
    try:
        seconds = parse_whole_seconds(given, option)
    except DurationError as exc:
        raise JobSpecError(str(exc)) from None
    if seconds < LEAST_DURATION:
        raise JobSpecError(f"{option} must be at least {LEAST_DURATION} seconds, got {given}: Azure ML "
                           "reads a shorter duration as days (azure-ai-ml raises a sweep's to 60 s)")
    return seconds


def queue_settings(job_tier: str | None, priority: str | None, compute: str) -> QueueSettings | None:
    """`--job-tier` and `--priority` as the job's queue settings (None: neither given), for serverless
    compute only."""
    if job_tier is None and priority is None:
        return None
    tier = None if job_tier is None else str(job_tier).lower()
    level = None if priority is None else str(priority).lower()
    if tier in _SINGULARITY_TIERS:
        raise JobSpecError(f"--job-tier {job_tier}: a tier of Singularity virtual clusters, which hvdazure "
                           f"does not submit to; serverless compute's are {' and '.join(JOB_TIERS)}")
    if tier is not None and tier not in JOB_TIERS:
        raise JobSpecError(f"--job-tier {job_tier!r}: expected {' or '.join(JOB_TIERS)}")
    if level is not None and level not in PRIORITIES:
        raise JobSpecError(f"--priority {priority!r}: expected {', '.join(PRIORITIES)}")
    if compute != SERVERLESS:
        option = "--job-tier" if tier is not None else "--priority"
        raise JobSpecError(f"{option} is a queue setting of serverless compute (--compute serverless): "
                           f"compute {compute}'s VMs are dedicated or low priority as the cluster was "
                           "created (hvdazure azure compute create --low-priority)")
    return QueueSettings(job_tier=tier, priority=level)
