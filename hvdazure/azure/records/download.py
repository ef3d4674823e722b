"""`hvdazure jobs download`: a job's files and outputs, put in place only once complete, and every
checkpoint directory among them verified against its manifests. No Azure SDK.

The layout is azure-ai-ml's `jobs.download`'s, which SDK v1's download follows:

    TO/artifacts/...           the job's own files: ./outputs (checkpoints/ by default), logs, user_logs/
    TO/named-outputs/NAME/...  each named output (SDK v2)

Everything is downloaded into `TO/.hvdazure-download-XXXX` first and renamed into place when the SDK is done,
so an interrupted download leaves no part that looks complete (the next one removes nothing: it refuses a
part that exists, before downloading anything).

A checkpoint directory (one with a `latest` pointer, or `step-*/manifest.json`) is verified as any reader
verifies it (core/checkpoint/integrity.py): each checkpoint with a manifest must have every file it lists,
of its size and hash. A damaged one is renamed `step-00000120.damaged`, which no hvdazure reader takes for
a checkpoint (a `latest` naming it falls back to the newest valid one, with a warning), and the download is
reported failed in one line naming it. A step directory without a manifest is a save cut short (a preempted
writer leaves one): no reader takes it either, so it is noted, not a failure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvdazure.azure.errors import JobError
from hvdazure.core.checkpoint.integrity import MANIFEST, CheckpointError
from hvdazure.core.checkpoint.store import LATEST, CheckpointManager, is_checkpoint_name, step_and_version

ARTIFACTS = "artifacts"  # azure-ai-ml's names for the two parts of a download
NAMED_OUTPUTS = "named-outputs"
DAMAGED_SUFFIX = ".damaged"
_STAGING_PREFIX = ".hvdazure-download-"


@dataclass(frozen=True)
class CheckpointCheck:
    """The checkpoints of one downloaded checkpoint directory, verified."""

    directory: Path
    valid: tuple[str, ...]  # by step, oldest first
    damaged: tuple[tuple[str, str], ...] = ()  # (name, why), each renamed NAME.damaged
    incomplete: tuple[str, ...] = ()  # step directories without a manifest
    latest: str | None = None  # what the `latest` pointer names

    def as_dict(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "valid": list(self.valid), "latest": self.latest,
                "damaged": [{"checkpoint": name, "renamed": name + DAMAGED_SUFFIX, "why": why}
                            for name, why in self.damaged],
                "incomplete": list(self.incomplete)}

    def line(self) -> str:
        newest = self.valid[-1] if self.valid else None
        text = f"checkpoints in {self.directory}: {len(self.valid)} verified"
        if newest:
            text += f" (newest {newest}" + (", named by latest)" if newest == self.latest else ")")
        if self.damaged:
            text += f"; damaged, renamed *{DAMAGED_SUFFIX}: " + ", ".join(name for name, _ in self.damaged)
        if self.incomplete:
            text += "; saves cut short (no manifest, not checkpoints): " + ", ".join(self.incomplete)
        return text


@dataclass(frozen=True)
class Downloaded:
    """What `hvdazure jobs download` put where, and what it found of the checkpoints among it."""

    name: str
    sdk: str
    to: Path
    parts: tuple[Path, ...]
    checks: tuple[CheckpointCheck, ...] = field(default_factory=tuple)

    def failure(self) -> str | None:
        """One line naming every damaged checkpoint, or None when every checkpoint verified."""
        damaged = [(check, name, why) for check in self.checks for name, why in check.damaged]
        if not damaged:
            return None
        first_check, first, why = damaged[0]
        newest = first_check.valid[-1] if first_check.valid else None
        others = [other for _, other, _ in damaged[1:]]
        more = f" (and {len(others)} more: {', '.join(others)})" if others else ""
        return (f"job {self.name}: checkpoint {first} in {first_check.directory} is damaged ({why}){more}: "
                f"renamed {first}{DAMAGED_SUFFIX}, which no reader takes for a checkpoint; newest valid "
                f"checkpoint there: {newest or 'none'}")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "sdk": self.sdk, "to": str(self.to), "parts": [str(p) for p in self.parts],
                "checkpoints": [check.as_dict() for check in self.checks]}

    def report(self) -> list[str]:
        parts = ", ".join(str(part.relative_to(self.to)) for part in self.parts)
        lines = [f"downloaded job {self.name} (SDK {self.sdk}) to {self.to}: {parts or 'nothing (no files)'}"]
        lines += [check.line() for check in self.checks]
        return lines


def parts_for(output: str | None) -> list[str]:
    """The parts a download writes: one named output, or the job's files and all its named outputs."""
    return [f"{NAMED_OUTPUTS}/{output}"] if output else [ARTIFACTS, NAMED_OUTPUTS]


def download(name: str, sdk: str, to: Path, output: str | None,
             fetch: Callable[[Path], None]) -> Downloaded:
    """Have `fetch` download into a staging folder in `to` (in the layout above), verify the checkpoint
    directories among it, then rename the parts into place. A part that exists in `to` already is refused
    first; a part the job does not have is refused after (`output`)."""
    wanted = parts_for(output)
    if taken := [part for part in wanted if (to / part).exists()]:
        raise JobError(f"{to / taken[0]} exists: remove it, or download into another folder (--to DIR)")
    to.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=to))
    try:
        fetch(staging)
        present = [part for part in wanted if (staging / part).exists()]
        if output and not present:
            raise JobError(f"job {name}: output {output!r} holds no files (nothing downloaded)")
        checks = tuple(verify_checkpoints(directory, staging, to)
                       for directory in _checkpoint_directories(staging))
        for part in present:
            (to / part).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / part, to / part)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Downloaded(name=name, sdk=sdk, to=to, parts=tuple(to / part for part in present), checks=checks)


def verify_checkpoints(directory: Path, staging: Path | None = None,
                       to: Path | None = None) -> CheckpointCheck:
    """Verify every checkpoint in `directory` (each file's size and hash, against its manifest), renaming each
    damaged one NAME.damaged. `staging` and `to`: where `directory` is now and where it is going, for the
    paths the result names."""
    manager = CheckpointManager(str(directory))
    valid, damaged, incomplete = [], [], []
    for entry in sorted(directory.iterdir(), key=_step_order):
        if not (entry.is_dir() and is_checkpoint_name(entry.name)):
            continue
        if not (entry / MANIFEST).is_file():
            incomplete.append(entry.name)
            continue
        try:
            manager.open(str(entry), verify=True)
            valid.append(entry.name)
        except CheckpointError as exc:
            why = str(exc).replace(f"checkpoint {entry}: ", "").replace(str(entry), entry.name)
            damaged.append((entry.name, why))
            entry.rename(entry.with_name(entry.name + DAMAGED_SUFFIX))
    pointer = directory / LATEST
    latest = pointer.read_text(errors="replace").strip() if pointer.is_file() else None
    shown = to / directory.relative_to(staging) if staging is not None and to is not None else directory
    return CheckpointCheck(shown, tuple(valid), tuple(damaged), tuple(incomplete), latest)


def _checkpoint_directories(root: Path) -> Iterator[Path]:
    """Every directory under `root` that holds checkpoints (a `latest` pointer, or a step-* directory
    with a manifest), not looking inside the checkpoints themselves."""
    for current, directories, files in os.walk(root):
        here = Path(current)
        steps = [d for d in directories if is_checkpoint_name(d)]
        if LATEST in files or any((here / d / MANIFEST).is_file() for d in steps):
            yield here
            directories[:] = [d for d in directories if not is_checkpoint_name(d)]


def _step_order(entry: Path) -> tuple[int, int]:
    return step_and_version(entry.name) if is_checkpoint_name(entry.name) else (-1, 0)
