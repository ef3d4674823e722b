"""Where a submitted job keeps its checkpoints, and which one is its last. No Azure SDK.

The job's command says where: `--set checkpoint_dir=${{outputs.NAME}}` puts them in the output NAME (the
guide's "Checkpoints on a datastore"), any other `checkpoint_dir=URL` in that storage, and without one the
trainer's Azure ML default is `./outputs/checkpoints`, which Azure ML uploads with the job's files
(core/environments/azureml.py). The last checkpoint is the one the directory's `latest` pointer names, and
its step is its manifest's (core/checkpoint/store.py's layout): both read through a reader each SDK gives
(v2/jobs.py, v1/jobs.py), so nothing here needs to download a checkpoint to name it.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from hvdazure.azure.records.job import JobDetails
from hvdazure.azure.script_args import settings
from hvdazure.core.checkpoint.integrity import MANIFEST
from hvdazure.core.checkpoint.store import LATEST, is_checkpoint_name

DEFAULT_IN_JOB = "outputs/checkpoints"  # the trainer's default inside an Azure ML job, among the job's files
_OUTPUT = re.compile(r"^\$\{\{\s*outputs\.([A-Za-z0-9_]+)\s*\}\}/?(.*)$")

# reads one file of a checkpoint directory, by its path in it ("latest", "step-00000120/manifest.json");
# None when it is not there or cannot be read
Reader = Callable[[str], bytes | None]


@dataclass(frozen=True)
class CheckpointPlace:
    """Where a job's checkpoints are: an output of the job, its own files, or storage named by URL."""

    kind: Literal["output", "job files", "url"]
    where: str  # the output's name and a path in it, a path among the job's files, or the URL

    def describe(self) -> str:
        output, _, sub = self.where.partition("/")
        if self.kind == "output":
            return f"output {output}" + (f" ({sub})" if sub else "")
        return f"the job's {self.where}" if self.kind == "job files" else self.where


@dataclass(frozen=True)
class LastCheckpoint:
    """The checkpoint a job's `latest` pointer names, and its step (its manifest's, else its name's)."""

    name: str
    step: int
    place: CheckpointPlace


def checkpoint_place(job: JobDetails) -> CheckpointPlace | None:
    """Where `job` keeps its checkpoints, read from its command (command_checkpoint_place); None for a job
    whose command is unknown."""
    argv = job.argv
    return command_checkpoint_place(argv) if argv else None


def command_checkpoint_place(argv: Sequence[str]) -> CheckpointPlace:
    """Where a command, or a script's arguments, put the checkpoints: its `--set checkpoint_dir=...` (the
    last one given wins, as TrainConfig reads them), or the Azure ML default without one."""
    value = next((s.value for s in reversed(settings(argv)) if s.field == "checkpoint_dir"), None)
    if value is None:
        return CheckpointPlace("job files", DEFAULT_IN_JOB)
    if match := _OUTPUT.match(value):
        return CheckpointPlace("output", posixpath.join(match[1], match[2]).rstrip("/"))
    if "://" in value:
        return CheckpointPlace("url", value)
    return CheckpointPlace("job files", posixpath.normpath(value.removeprefix("./")))


def last_checkpoint(place: CheckpointPlace, read: Reader) -> LastCheckpoint | None:
    """The checkpoint `latest` names in the directory `read` reads, with its manifest's step; None when
    there is no readable pointer."""
    pointer = read(LATEST)
    name = pointer.decode(errors="replace").strip() if pointer else ""
    if not is_checkpoint_name(name):
        return None
    manifest = read(f"{name}/{MANIFEST}")
    try:
        recorded = json.loads(manifest)["step"] if manifest else None
    except (ValueError, KeyError, TypeError):
        recorded = None
    from_name = int(name.removeprefix("step-").split("-")[0])
    step = recorded if isinstance(recorded, int) and not isinstance(recorded, bool) else from_name
    return LastCheckpoint(name, step, place)


def url_reader(url: str) -> Reader:
    """A reader of the checkpoint directory at `url` (any fsspec URL: abfs:// with the credentials of this
    machine's environment), for a job whose checkpoint_dir is a URL."""
    from hvdazure.core.object_store import filesystem

    def read(relative: str) -> bytes | None:
        try:
            fs, root = filesystem(url)
            return bytes(fs.cat_file(posixpath.join(root, relative)))
        except Exception:  # missing, no credentials here, unreachable: the step is then not shown
            return None

    return read
