"""A preempted job, as Azure ML reports it, and the command that resumes it. No Azure SDK.

Azure's documentation of compute clusters says of low-priority VMs that they "may be preempted while in
use" and "You'll have to restart a preempted job" (learn.microsoft.com/azure/machine-learning/
how-to-create-attach-compute-cluster, "Lower your compute cluster cost"); the cost guide recommends them
where interruptions are recoverable "through restarts (for deep learning training with checkpointing)"
(how-to-manage-optimize-cost, "Use low-priority VMs"). There is no "Preempted" job status (azure-ai-ml's
JobStatus lists none): the service reports it in words. Users have quoted the job's error
`AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted. Check if the run has failed
or restarted. Reason: Received pre-emption warning signal` (Azure/MachineLearningNotebooks#1242,
MicrosoftDocs/azure-docs#66288, on a Failed job), and Microsoft's hi-ml documentation a warning on the
job's page, "Low priority compute preemption warning: a node has been preempted", on a job Azure ML runs
again. So a job counts as preempted when its Run History error or one of its warnings says "preempt"
(or "pre-empt"); guides/azure-ml.md says the same for users.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hvdazure.azure.errors import SubmitError
from hvdazure.azure.records.checkpoints import CheckpointPlace, LastCheckpoint, checkpoint_place
from hvdazure.azure.records.job import JobDetails
from hvdazure.azure.spec.resume_from import resume_command

_PREEMPTED = re.compile(r"\bpre-?empt", re.I)


@dataclass(frozen=True)
class Preemption:
    """A job the service reports preempted: what it said, its last checkpoint, and how to go on."""

    reported: str  # the service's own words
    status: str
    ended: bool  # True: the job ended (resume it); False: Azure ML runs it again
    place: CheckpointPlace | None
    last: LastCheckpoint | None
    resume_command: str | None  # what resumes it (resume_from.resume_command); None: --resume-from cannot
    not_resumable: str | None = None  # why --resume-from cannot

    def line(self) -> str:
        """`preempted at step N (last checkpoint ...), resume with: hvdazure submit ...`."""
        if self.last is not None:
            last = self.last
            where = f"at step {last.step} (last checkpoint {last.name} in {last.place.describe()})"
        elif self.place is not None:
            where = f"(no checkpoint could be read from {self.place.describe()})"
        else:
            where = "(where its checkpoints are is unknown)"
        if self.ended and self.resume_command is None:
            return f"preempted {where}; not resumable with --resume-from: {self.not_resumable}"
        if self.ended:
            return f"preempted {where}, resume with: {self.resume_command}"
        return f"preempted {where}; Azure ML runs it again (status {self.status})"

    def as_dict(self) -> dict[str, Any]:
        return {"reported": self.reported, "ended": self.ended, "line": self.line(),
                "checkpoints": self.place.describe() if self.place else None,
                "last_checkpoint": self.last.name if self.last else None,
                "step": self.last.step if self.last else None,
                "resume_command": self.resume_command if self.ended else None,
                "not_resumable": self.not_resumable if self.ended else None}


def reported_preemption(job: JobDetails) -> str | None:
    """The service's line that says `job` was preempted (its error first, then its warnings), or None."""
    facts = job.facts
    return next((text for text in (facts.error, *facts.warnings) if text and _PREEMPTED.search(text)), None)


def preemption(job: JobDetails,
               read_last: Callable[[CheckpointPlace], LastCheckpoint | None]) -> Preemption | None:
    """The job's preemption, where the service reports one, with its last checkpoint as `read_last` finds
    it in the place the job's command names (None: not preempted)."""
    reported = reported_preemption(job)
    if reported is None:
        return None
    place = checkpoint_place(job)
    last = read_last(place) if place is not None else None
    try:
        command, why_not = resume_command(job), None
    except SubmitError as exc:  # what --resume-from would refuse, in its words
        command, why_not = None, str(exc).removeprefix(f"--resume-from {job.name}: ")
    return Preemption(reported=reported, status=job.status, ended=job.ended, place=place, last=last,
                      resume_command=command, not_resumable=why_not)
