"""Checkpoints in storage: written atomically, verified before use, pruned by policy. Framework-agnostic.

Only rank 0 uses a CheckpointManager and it runs no collectives; the trainer binding decides what goes into
the files and the manifest. The layout of a checkpoint directory:

    step-00000120/              one checkpoint: the binding's files, then manifest.json
        model.pt
        manifest.json           the binding's metadata + format_version, step, created, files (hash, bytes),
                                and the run_id of the run that wrote it
    step-00000120-v2/           the same step saved again (a run resumed from an earlier checkpoint)
    latest                      the name of the newest checkpoint ("step-00000120")
    .tmp-step-00000130-<uuid>/  a local save in progress, or left by a writer that was killed
                                (cleanup_temporaries)

Each save goes under a name no checkpoint directory has, and nothing that `latest` names is ever moved or
replaced: saving a step that already has a checkpoint writes a new version beside it (step-00000120-v2)
and deletes the old one only after `latest` names the new one, so a crash at any point leaves `latest`
naming a complete checkpoint of that step. How a save is made atomic depends on the storage:

- On a local filesystem, every file goes into a temporary directory, then manifest.json; they are fsynced,
  the directory is renamed into place (atomic: a checkpoint directory is complete or absent), and only
  then is `latest` replaced (a temporary file renamed over it).
- On an object store (abfs:// on Azure Blob, through adlfs; any fsspec URL that is not a local path) there
  are no directories, no rename of a prefix, and a "directory" exists only while an object's name starts
  with it. Each file is uploaded straight to its place (step-00000120/model.pt), one after the other, and
  manifest.json is uploaded last, under its final name: it is the commit record, and one upload of a blob
  is atomic (it is there in full or not at all). Then `latest` is uploaded over the old pointer. A writer
  killed half-way leaves files without a manifest, which no reader takes for a checkpoint and the next
  retention deletes; its name stays taken while anything is left under it.

Retention deletes older checkpoints last, each manifest first, so that a deletion interrupted half-way
leaves no manifest over missing files. Still, nothing trusts a checkpoint for existing: manifest.json
records the hash and size of every file, verification checks them all, `latest_valid` skips (with a
warning naming it) a checkpoint that is truncated, corrupt or half-written, falling back to the previous
one, and retention counts only checkpoints that verify. On object stores, each storage operation is
retried on transient errors (throttling, 5xx, dropped connections, truncated bodies) with bounded backoff,
and fails for good with one line naming the URL (hvdazure.core.object_store); no credential is written
into a manifest or a message.

A resume reads each file once, through the hash: on a local disk in place (then loaded from there), from
other storage into a local temporary file, so rank 0 never holds a checkpoint's bytes in memory beside the
tensors loaded from them (`local_files`).

The hashes, the manifest's shape and the verifying reads are core/checkpoint/integrity.py's; loading
weights from a checkpoint without the trainer (the bindings' `load_weights`) is core/checkpoint/weights.py's.

A directory holds the checkpoints of one run. Every manifest records its run's id (`run_id`, made once
per run and kept across resumes); a manager writing for a run (`run_id=`) never counts or deletes another
run's checkpoints, and readers take `latest` and `best` within the run of the directory's newest checkpoint
(the one `latest` names). Checkpoints written before run ids have none: they load as before, and count with
any run (in a directory of them only, all of them are one run, as they always were). Refusing a new run in
a directory that holds another's is the trainer's (core/checkpoint/trainer_checkpoints.py).

All storage goes through fsspec
(imported on first use, so `import hvdazure` stays fast): local paths, file://, memory:// and abfs:// share
one code path: the manager looks only at whether the filesystem is local.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import posixpath
import re
import tempfile
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, BinaryIO, TypeVar

from hvdazure.core.checkpoint.integrity import (
    FORMAT_BY_HASH,
    FORMAT_VERSION,
    HASHES,
    MANIFEST,
    CallbackFailed,
    CheckpointError,
    HashingWriter,
    check_file_name,
    check_format,
    check_size,
    new_hash,
    read_manifest,
    storage_call,
    stream_verified,
)
from hvdazure.core.object_store import StorageError, filesystem, is_local, redact
from hvdazure.core.rank_logging import logger

# CheckpointError, StorageError and the format's names are the integrity layer's and the object store's;
# they are named here too, as the errors and constants of the store that raises and writes them.
__all__ = ["FORMAT_VERSION", "HASHES", "LATEST", "MANIFEST", "RUN_ID", "Checkpoint", "CheckpointError",
           "CheckpointManager", "StorageError", "checkpoint_name", "new_run_id", "pointer_directory",
           "same_directory", "same_run"]

LATEST = "latest"
RUN_ID = "run_id"  # the manifest key of the run a checkpoint belongs to
_TMP_PREFIX = ".tmp-"
_STEP_NAME = re.compile(r"step-(\d+)(?:-v(\d+))?")  # step number, and version when the step was re-saved
_RESERVED_KEYS = ("format_version", "step", "created", "files", RUN_ID)  # the manager writes these itself
_T = TypeVar("_T")


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint found in storage."""

    name: str  # "step-00000120": zero-padded so that names sort by step
    url: str  # full path or URL of its directory
    manifest: dict[str, Any]  # parsed manifest.json

    @property
    def step(self) -> int:
        return int(self.manifest["step"])

    @property
    def run_id(self) -> str | None:
        """The id of the run that wrote it; None for a checkpoint written before run ids."""
        run = self.manifest.get(RUN_ID)
        return run if isinstance(run, str) and run else None


def new_run_id() -> str:
    """A fresh run id: when the run started (UTC, to the second), then 8 random hex digits."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


def same_run(checkpoint: Checkpoint, run_id: str | None) -> bool:
    """Whether `checkpoint` counts as one of run `run_id`'s: its own, or written before run ids (it has none).
    Every checkpoint counts when `run_id` is None (a directory of such checkpoints)."""
    return run_id is None or checkpoint.run_id in (None, run_id)


def same_directory(first: str, second: str) -> bool:
    """Whether two paths or URLs name the same directory (local paths compared after resolving links)."""
    fs_first, root_first = filesystem(first.rstrip("/") or first)
    fs_second, root_second = filesystem(second.rstrip("/") or second)
    if is_local(fs_first) and is_local(fs_second):
        return os.path.realpath(root_first) == os.path.realpath(root_second)
    def where(fs: Any, root: str) -> tuple[Any, ...]:
        return fs.protocol, getattr(fs, "account_name", None), root.rstrip("/")

    return where(fs_first, root_first) == where(fs_second, root_second)


def checkpoint_name(step: int) -> str:
    """The directory name of the (first) checkpoint of optimizer step `step`."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    return f"step-{step:08d}"


def is_checkpoint_name(name: str) -> bool:
    """Whether `name` is a checkpoint directory's name as the store writes it (step-00000120, and
    step-00000120-v2 for a step saved again)."""
    return _STEP_NAME.fullmatch(name) is not None


def step_and_version(name: str) -> tuple[int, int]:
    """The sort key of a checkpoint directory name: step, then version (1 for a step saved once)."""
    match = _STEP_NAME.fullmatch(name)
    assert match is not None, name
    return int(match[1]), int(match[2] or 1)


def _newest_first(checkpoint: Checkpoint) -> tuple[int, int]:
    step, version = step_and_version(checkpoint.name)
    return -step, -version


def pointer_directory(path: str) -> str | None:
    """The checkpoint directory whose `latest` pointer file `path` is (a path or URL); None if it is not one.

    Users pass `resume=ckpt/latest`: it stands for the newest valid checkpoint in `ckpt`."""
    stripped = path.rstrip("/")
    head, _, base = stripped.rpartition("/")
    if base != LATEST:
        return None
    fs, root = filesystem(stripped)
    return (head or ".") if storage_call(fs, f"looking for {stripped}", lambda: fs.isfile(root)) else None


class CheckpointManager:
    """Saves, finds, verifies and prunes the checkpoints in one directory (a local path or fsspec URL).

    After each save it keeps the newest `keep_last` checkpoints, plus the best `keep_best` by
    manifest["metrics"][monitor] (lowest for mode "min", highest for "max"), and deletes the rest. With
    `run_id` (a writer's), each save records it, and retention counts and deletes only that run's
    checkpoints (and those written before run ids), never another run's.
    """

    def __init__(self, directory: str, keep_last: int = 3, keep_best: int = 0, monitor: str | None = None,
                 mode: str = "min", hash: str = HASHES[0], run_id: str | None = None) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        if keep_best < 0:
            raise ValueError(f"keep_best must be 0 or more, got {keep_best}")
        if keep_best > 0 and monitor is None:
            raise ValueError(f"keep_best={keep_best} needs a monitor: the metric that ranks checkpoints")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if hash not in HASHES:
            raise ValueError(f"hash must be one of {', '.join(HASHES)}, got {hash!r}")
        self.hash = hash
        self.directory = directory.rstrip("/") or directory
        self.keep_last, self.keep_best, self.monitor, self.mode = keep_last, keep_best, monitor, mode
        self.run_id = run_id
        self._fs, self._root = filesystem(self.directory)
        self._local = is_local(self._fs)
        # Checkpoints this manager wrote or verified in full, by name and files table: retention need not
        # hash them again (see _apply_retention).
        self._verified: set[tuple[str, str]] = set()

    # --- saving ------------------------------------------------------------------------------------------
    def save(self, step: int, files: Mapping[str, Callable[[BinaryIO], None]], manifest: Mapping[str, Any],
             on_durable: Callable[[Checkpoint], None] | None = None) -> Checkpoint:
        """Write one checkpoint: each callback writes one file's bytes to the binary file object it is given.

        The bytes are hashed as they pass through, so nothing is held twice in memory. Then manifest.json,
        the rename into place (under a new version's name if the step has a checkpoint already), `latest`,
        and retention (which deletes that older checkpoint of the step). `on_durable` is called once the
        checkpoint is complete, durable and named by `latest`, before retention: a caller waiting for
        the checkpoint need not wait for the deletion of older ones.
        """
        name = self._unused_name(step)
        for file_name in files:
            check_file_name(file_name)
        if clash := [key for key in _RESERVED_KEYS if key in manifest]:
            raise ValueError(f"manifest keys {clash} are written by the checkpoint manager; rename them")
        try:
            json.dumps(dict(manifest))  # fail before writing anything
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the manifest of {name} is not JSON: {exc}") from None

        # Local: a temporary directory renamed into place. Object stores: in place, the manifest last.
        target = self._path(f"{_TMP_PREFIX}{name}-{uuid.uuid4().hex}") if self._local else self._path(name)
        if self._local:
            self._fs.makedirs(target, exist_ok=True)
        try:
            records = {file_name: self._write(posixpath.join(target, file_name), write)
                       for file_name, write in files.items()}
            full = {**manifest, "format_version": FORMAT_BY_HASH[self.hash], "step": step,
                    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "files": records,
                    **({RUN_ID: self.run_id} if self.run_id is not None else {})}
            full = json.loads(redact(json.dumps(full)))  # a credential that made its way in stays out
            text = json.dumps(full, indent=2).encode()
            self._write(posixpath.join(target, MANIFEST), _bytes_writer(text))
            if self._local:
                _fsync(target)
                self._move_into_place(target, name)
        except BaseException:
            self._delete_checkpoint(target)  # nothing else has this name
            raise
        self._write_latest(name)
        checkpoint = Checkpoint(name, self._url(name), full)
        self._verified.add(_identity(checkpoint))  # its files were hashed as they were written
        if on_durable is not None:
            on_durable(checkpoint)
        self._apply_retention(name)
        return checkpoint

    def _unused_name(self, step: int) -> str:
        """checkpoint_name(step), or if the step has checkpoints already, the next version's name: an
        existing checkpoint (perhaps the one `latest` names) is never overwritten or moved."""
        versions = [step_and_version(name)[1] for name, _ in self._entries()
                    if _STEP_NAME.fullmatch(name) and step_and_version(name)[0] == step]
        return f"{checkpoint_name(step)}-v{max(versions) + 1}" if versions else checkpoint_name(step)

    def _write(self, path: str, write: Callable[[BinaryIO], object]) -> dict[str, Any]:
        """Write one file through `write`, hashing it; on an object store, again (calling `write` again)
        after a transient error."""
        try:
            return self._call(f"writing {self._url_of(path)}", lambda: self._write_once(path, write))
        except CallbackFailed as failed:  # the caller's error, not the storage's: raised as it was
            raise failed.error from None

    def _write_once(self, path: str, write: Callable[[BinaryIO], object]) -> dict[str, Any]:
        with self._fs.open(path, "wb") as raw:
            out = HashingWriter(raw, new_hash(self.hash))
            try:
                write(out)  # type: ignore[arg-type]
            except Exception as exc:
                if out.storage_failed:
                    raise
                raise CallbackFailed(exc) from exc
            raw.flush()
            if self._local:
                os.fsync(raw.fileno())
        return {self.hash: out.digest.hexdigest(), "bytes": out.bytes}

    def _move_into_place(self, tmp: str, name: str) -> None:
        self._fs.mv(tmp, self._path(name), recursive=True)
        if self._local:
            _fsync(self._root)

    def _write_latest(self, name: str) -> None:
        if not self._local:  # one upload replaces the pointer whole: readers see the old or the new
            self._write(self._path(LATEST), _bytes_writer(f"{name}\n".encode()))
            return
        tmp = self._path(f"{_TMP_PREFIX}{LATEST}-{uuid.uuid4().hex}")
        self._write(tmp, _bytes_writer(f"{name}\n".encode()))
        self._fs.mv(tmp, self._path(LATEST))
        if self._local:
            _fsync(self._root)

    def _apply_retention(self, just_written: str) -> None:
        """Keep the newest keep_last and best keep_best valid checkpoints, one per step (its newest valid
        version), and the one just written (which `latest` names); delete every other step-* directory:
        older checkpoints, superseded versions, and directories that do not verify (an interrupted copy),
        so that a half-copied checkpoint never takes the place of a valid one.

        Another run's checkpoints are neither counted nor deleted (with `run_id`; the trainer refuses to start
        a run in a directory that holds another's, so they are there only if two runs started at once).

        How much is verified: a checkpoint is kept only if its files have the sizes its manifest records
        (one listing per directory), which catches what an interrupted copy leaves: missing and short files.
        Contents are hashed only for a candidate whose status is unknown, once per manager: checkpoints it
        wrote itself (hashed as they were written) or verified in full are remembered, so a save in a
        steady run reads no data file, and the first save after a resume hashes at most the keep_last +
        keep_best candidates found in the directory. Candidates are verified lazily, newest (or best) first,
        so checkpoints about to be deleted are never hashed.
        """
        try:
            found = self.checkpoints()
            checkpoints = [c for c in found if same_run(c, self.run_id)]
            newest = sorted(checkpoints, key=_newest_first)
            keep = {just_written} | {c.name for c in found if not same_run(c, self.run_id)}
            keep |= {c.name for c in self._first_valid_per_step(newest, self.keep_last)}
            keep |= {c.name for c in self._first_valid_per_step(self._by_metric(checkpoints), self.keep_best)}
            doomed = [name for name in self._step_names() if name not in keep]
        except Exception as exc:  # the checkpoint is safely written; pruning can wait for the next save
            logger.warning(f"checkpoint retention in {self.directory} skipped: {exc}")
            return
        for name in doomed:
            self._delete_checkpoint(self._path(name))

    def _first_valid_per_step(self, ranked: list[Checkpoint], count: int) -> list[Checkpoint]:
        """The first `count` checkpoints of `ranked` that verify, at most one per step."""
        chosen: list[Checkpoint] = []
        steps: set[int] = set()
        for checkpoint in ranked:
            if len(chosen) == count:
                break
            if checkpoint.step not in steps and self._is_valid(checkpoint):
                chosen.append(checkpoint)
                steps.add(checkpoint.step)
        return chosen

    def _is_valid(self, checkpoint: Checkpoint) -> bool:
        """Sizes always; hashes unless this manager wrote or verified the checkpoint. Storage errors raise."""
        try:
            check_format(checkpoint.url, checkpoint.manifest)
            self._check_sizes(checkpoint)
            if _identity(checkpoint) not in self._verified:
                self.verify(checkpoint)
        except CheckpointError:
            return False
        return True

    def _check_sizes(self, checkpoint: Checkpoint) -> None:
        path = self._path(checkpoint.name)
        entries = self._call(f"listing {checkpoint.url}", lambda: self._fs.ls(path, detail=True))
        listing = {posixpath.basename(entry["name"].rstrip("/")): entry for entry in entries}
        for file_name in checkpoint.manifest["files"]:
            entry = listing.get(file_name)
            if entry is None or entry["type"] != "file":
                raise CheckpointError(f"checkpoint {checkpoint.url}: file {file_name!r} is missing")
            check_size(checkpoint.url, checkpoint.manifest, file_name, entry["size"])

    # --- finding -----------------------------------------------------------------------------------------
    def checkpoints(self) -> list[Checkpoint]:
        """The step-* directories with a readable manifest.json, by step; checksums are not verified here."""
        found = []
        for name in self._step_names():
            try:
                found.append(self._load(name))
            except CheckpointError:
                continue
        return sorted(found, key=lambda c: (c.step, c.name))

    def latest_valid(self) -> tuple[Checkpoint | None, list[str]]:
        """The newest checkpoint that verifies: the one `latest` names, else those of its run, newest first.

        Each invalid one skipped adds a warning naming it and why. (None, warnings) if none is valid.
        Storage errors (permissions, authentication) are raised, not skipped.
        """
        warnings: list[str] = []
        for checkpoint in self._candidates(warnings):
            try:
                self.verify(checkpoint)
                return checkpoint, warnings
            except CheckpointError as exc:
                warnings.append(f"skipping invalid {exc}")
        return None, warnings

    @contextlib.contextmanager
    def open_latest_valid(self) -> Iterator[tuple[Checkpoint | None, dict[str, str], list[str]]]:
        """As latest_valid, with the chosen checkpoint's `local_files` (for a resume): each file is read
        once, verified as it is read. Yields (None, {}, warnings) if no checkpoint is valid."""
        warnings: list[str] = []
        with self._first_valid(self._candidates(warnings), None, warnings) as (checkpoint, paths):
            yield checkpoint, paths, warnings

    @contextlib.contextmanager
    def open_valid(self, which: str, names: Collection[str]) -> Iterator[tuple[Checkpoint, dict[str, str]]]:
        """The checkpoint `which` names, as `resolve` chooses it, with the `local_files` of `names` among its
        files (for loading weights): every file of each candidate is read once, verified as it is read (the
        others only streamed through the hash), where resolving and then reading would read them twice.
        Invalid candidates are skipped with a warning, as `resolve` skips them; a path is not skipped."""
        if which not in ("latest", "best"):
            opened = self.open(which, verify=False)
            with self.local_files(opened, names, verify_rest=True) as paths:
                yield opened, paths
            return
        if which == "best" and self.monitor is None:
            raise CheckpointError("resolving 'best' needs a monitor: the metric that ranks checkpoints")
        warnings: list[str] = []
        candidates = (self._candidates(warnings) if which == "latest" else
                      iter(self._by_metric(self._of_current_run(self.checkpoints()))))
        with self._first_valid(candidates, names, warnings) as (checkpoint, paths):
            for warning in warnings:
                logger.warning(warning)
            if checkpoint is None:
                raise self._no_best() if which == "best" else CheckpointError(
                    f"no valid checkpoint in {self.directory}")
            yield checkpoint, paths

    @contextlib.contextmanager
    def _first_valid(self, candidates: Iterator[Checkpoint], names: Collection[str] | None,
                     warnings: list[str]) -> Iterator[tuple[Checkpoint | None, dict[str, str]]]:
        """The first of `candidates` whose files all verify, with the `local_files` of `names` (None: all);
        each one skipped adds a warning. (None, {}) if none does."""
        for checkpoint in candidates:
            if names is not None:  # a file the checkpoint lacks is the caller's mistake: not skipped
                _check_holds(checkpoint, names)
            files = contextlib.ExitStack()
            try:
                paths = files.enter_context(self.local_files(checkpoint, names, verify_rest=True))
            except CheckpointError as exc:  # only choosing is retried: errors of the caller's block are not
                warnings.append(f"skipping invalid {exc}")
                continue
            with files:
                yield checkpoint, paths
            return
        yield None, {}

    def _candidates(self, warnings: list[str]) -> Iterator[Checkpoint]:
        """The checkpoints to try for the newest valid one, not yet verified: `latest`'s first, then by step,
        of one run: this manager's, else the first run id met (`latest`'s, if its manifest can be read);
        those without a run id count with any. Each one whose manifest cannot be read adds a warning."""
        run = self.run_id
        for name in self._names_to_try(warnings):
            try:
                checkpoint = self._load(name)
            except CheckpointError as exc:
                warnings.append(f"skipping invalid {exc}")
                continue
            run = run or checkpoint.run_id
            if same_run(checkpoint, run):
                yield checkpoint

    def _names_to_try(self, warnings: list[str]) -> list[str]:
        """The step-* names to try for the newest valid checkpoint: `latest`'s first, then by step."""
        names = self._step_names()
        pointed = self._read_latest()
        if pointed is not None and pointed not in names:
            warnings.append(f"`latest` in {self.directory} names {pointed!r}, which is not a checkpoint")
            pointed = None
        return ([pointed] if pointed else []) + [n for n in reversed(names) if n != pointed]

    def best(self) -> Checkpoint | None:
        """The best checkpoint of the current run by manifest["metrics"][monitor] (not verified); None without
        a monitor."""
        if self.monitor is None:
            return None
        ranked = self._by_metric(self._of_current_run(self.checkpoints()))
        return ranked[0] if ranked else None

    def open(self, path: str, verify: bool = True) -> Checkpoint:
        """The checkpoint in directory `path` (a path or URL), verified unless `verify` is False (for a
        caller about to read_files, which verifies as it reads); CheckpointError if it is invalid."""
        fs, root = filesystem(path)
        url = path.rstrip("/")
        checkpoint = Checkpoint(posixpath.basename(root.rstrip("/")), url, read_manifest(fs, root, url))
        if verify:
            self.verify(checkpoint)
        return checkpoint

    def resolve(self, which: str) -> Checkpoint:
        """The checkpoint `which` names: "latest" (newest valid), "best" (best that verifies, of the current
        run) or a path."""
        if which == "latest":
            checkpoint, warnings = self.latest_valid()
            for warning in warnings:
                logger.warning(warning)
            if checkpoint is None:
                raise CheckpointError(f"no valid checkpoint in {self.directory}")
            return checkpoint
        if which == "best":
            if self.monitor is None:
                raise CheckpointError("resolving 'best' needs a monitor: the metric that ranks checkpoints")
            for checkpoint in self._by_metric(self._of_current_run(self.checkpoints())):
                try:
                    self.verify(checkpoint)
                    return checkpoint
                except CheckpointError as exc:
                    logger.warning(f"skipping invalid {exc}")
            raise self._no_best()
        return self.open(which)

    def _no_best(self) -> CheckpointError:
        """'best' found nothing: which metrics the run's checkpoints do record, and the ways on."""
        recorded = sorted({name for c in self._of_current_run(self.checkpoints())
                           for name in (c.manifest.get("metrics") or {})})
        return CheckpointError(
            f"no valid checkpoint in {self.directory} has the metric {self.monitor!r} (the run's monitor; "
            f"its checkpoints record {', '.join(recorded) or 'no metrics'}): take 'latest' or a checkpoint's "
            "path, or train with monitor set to a metric validation_step returns")

    def current_run(self, checkpoints: list[Checkpoint]) -> str | None:
        """The run the directory's `checkpoints` (as `checkpoints()` lists them) are read as: this manager's,
        else that of the one `latest` names, else of the newest; None when it has no run id (written before
        run ids), or there are none."""
        if self.run_id is not None:
            return self.run_id
        pointed = self._read_latest()
        newest = next((c for c in checkpoints if c.name == pointed), None) or max(
            checkpoints, key=lambda c: step_and_version(c.name), default=None)
        return newest.run_id if newest is not None else None

    def _of_current_run(self, checkpoints: list[Checkpoint]) -> list[Checkpoint]:
        run = self.current_run(checkpoints)
        return [c for c in checkpoints if same_run(c, run)]

    def exists(self) -> bool:
        """Whether the directory exists (on an object store: whether anything is stored under its name)."""
        return bool(self._call(f"looking for {redact(self.directory)}", lambda: self._fs.exists(self._root)))

    def _step_names(self) -> list[str]:
        names = [name for name, kind in self._entries() if kind == "directory" and _STEP_NAME.fullmatch(name)]
        return sorted(names, key=step_and_version)

    def _entries(self) -> list[tuple[str, str]]:
        try:
            listing = self._call(f"listing {redact(self.directory)}",
                                 lambda: self._fs.ls(self._root, detail=True))
        except FileNotFoundError:
            return []
        return [(posixpath.basename(entry["name"].rstrip("/")), entry["type"]) for entry in listing]

    def _load(self, name: str) -> Checkpoint:
        url = self._url(name)
        return Checkpoint(name, url, read_manifest(self._fs, self._path(name), url))

    def _read_latest(self) -> str | None:
        path = self._path(LATEST)
        try:
            data = self._call(f"reading {self._url(LATEST)}", lambda: self._fs.cat_file(path))
        except FileNotFoundError:
            return None
        return bytes(data).decode(errors="replace").strip()

    def _by_metric(self, checkpoints: list[Checkpoint]) -> list[Checkpoint]:
        """Checkpoints that have the monitored metric, best first; on a tie the newer one first."""
        sign = 1 if self.mode == "min" else -1
        scored = [(value, c) for c in checkpoints if (value := self._metric(c)) is not None]
        return [c for _, c in sorted(scored, key=lambda vc: (sign * vc[0], *_newest_first(vc[1])))]

    def _metric(self, checkpoint: Checkpoint) -> float | None:
        metrics = checkpoint.manifest.get("metrics")
        value = metrics.get(self.monitor) if isinstance(metrics, dict) and self.monitor else None
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            return None
        return float(value)

    # --- verifying and reading -----------------------------------------------------------------------------
    def verify(self, checkpoint: Checkpoint) -> None:
        """CheckpointError unless every listed file is there with its recorded size and hash (streamed).
        A storage error (an unreadable file, a failed authentication) is raised as it is."""
        check_format(checkpoint.url, checkpoint.manifest)
        fs, root = filesystem(checkpoint.url)
        for file_name in checkpoint.manifest["files"]:
            stream_verified(fs, root, checkpoint.url, checkpoint.manifest, file_name)
        self._verified.add(_identity(checkpoint))

    @contextlib.contextmanager
    def local_files(self, checkpoint: Checkpoint, names: Collection[str] | None = None,
                    verify_rest: bool = False) -> Iterator[dict[str, str]]:
        """Local paths of the checkpoint's files (or of `names` among them), each read once and verified
        before it is yielded: on a local filesystem in place; from other storage, streamed through the
        hash into a temporary directory that is removed on exit. Memory use is one chunk, whatever the
        size. With `verify_rest`, the checkpoint's other files are verified too (streamed through the hash,
        not copied). CheckpointError if a file is missing or does not match; storage errors are raised as
        they are. In place, the files are those verified as long as nobody rewrites them: checkpoint
        directories are written once and only ever deleted.
        """
        check_format(checkpoint.url, checkpoint.manifest)
        wanted = list(checkpoint.manifest["files"] if names is None else names)
        _check_holds(checkpoint, wanted)
        fs, root = filesystem(checkpoint.url)
        rest = [name for name in checkpoint.manifest["files"] if name not in wanted] if verify_rest else []
        for file_name in rest:
            stream_verified(fs, root, checkpoint.url, checkpoint.manifest, file_name)
        if is_local(fs):
            for file_name in wanted:
                stream_verified(fs, root, checkpoint.url, checkpoint.manifest, file_name)
            self._remember_if_complete(checkpoint, wanted + rest)
            yield {file_name: posixpath.join(root, file_name) for file_name in wanted}
            return
        with tempfile.TemporaryDirectory(prefix="hvdazure-checkpoint-") as tmp:
            paths = {file_name: os.path.join(tmp, file_name) for file_name in wanted}
            for file_name, path in paths.items():
                with open(path, "wb") as copy:
                    stream_verified(fs, root, checkpoint.url, checkpoint.manifest, file_name, copy)
            self._remember_if_complete(checkpoint, wanted + rest)
            yield paths

    def _remember_if_complete(self, checkpoint: Checkpoint, verified: Collection[str]) -> None:
        if set(verified) == set(checkpoint.manifest["files"]):
            self._verified.add(_identity(checkpoint))

    def read_files(self, checkpoint: Checkpoint) -> dict[str, bytes]:
        """Every listed file's bytes, each read once and verified; CheckpointError on a mismatch. This holds
        the whole checkpoint in memory: for small files and tests; a resume loads from `local_files`."""
        check_format(checkpoint.url, checkpoint.manifest)
        fs, root = filesystem(checkpoint.url)
        contents = {}
        for file_name in checkpoint.manifest["files"]:
            buffer = io.BytesIO()
            stream_verified(fs, root, checkpoint.url, checkpoint.manifest, file_name, buffer)
            contents[file_name] = buffer.getvalue()
        return contents

    # --- cleaning up -------------------------------------------------------------------------------------
    def cleanup_temporaries(self) -> list[str]:
        """Remove what an interrupted save left behind (.tmp-* entries); returns their names."""
        return [name for name, _ in self._entries()
                if name.startswith(_TMP_PREFIX) and self._delete(self._path(name))]

    def _delete_checkpoint(self, path: str) -> bool:
        """Delete a checkpoint directory, its manifest first: interrupted, it leaves no manifest over
        missing files (and on an object store, no name reused while anything is left under it)."""
        return self._delete(posixpath.join(path, MANIFEST)) and self._delete(path)

    def _delete(self, path: str) -> bool:
        def delete() -> None:
            if self._fs.exists(path):
                self._fs.rm(path, recursive=True)

        try:
            self._call(f"deleting {self._url_of(path)}", delete)
            return True
        except Exception as exc:  # storage errors differ by backend; a leftover is only wasted space
            logger.warning(f"could not delete {path} from {redact(self.directory)}: {exc}")
            return False

    def _call(self, what: str, call: Callable[[], _T]) -> _T:
        return storage_call(self._fs, what, call)

    def _path(self, name: str) -> str:
        return posixpath.join(self._root, name)

    def _url(self, name: str) -> str:
        return f"{self.directory}/{name}"

    def _url_of(self, path: str) -> str:
        """The URL of a storage path under the directory, for messages."""
        return redact(self._url(posixpath.relpath(path, self._root)) if path.startswith(self._root) else path)


def _identity(checkpoint: Checkpoint) -> tuple[str, str]:
    """What a verified checkpoint is remembered by: its name and its files' recorded sizes and hashes."""
    return checkpoint.name, json.dumps(checkpoint.manifest["files"], sort_keys=True)


def _check_holds(checkpoint: Checkpoint, names: Collection[str]) -> None:
    """CheckpointError unless the checkpoint has every file of `names` (saying which framework wrote it)."""
    if missing := [name for name in names if name not in checkpoint.manifest["files"]]:
        raise CheckpointError(f"checkpoint {checkpoint.url} holds no {missing[0]} (framework: "
                              f"{checkpoint.manifest.get('framework')!r})")


def _bytes_writer(data: bytes) -> Callable[[BinaryIO], None]:
    """A file callback that writes `data`."""
    def write(file: BinaryIO) -> None:
        file.write(data)

    return write



def _fsync(path: str) -> None:
    """Flush a local file's or directory's entry to disk (a directory: the renames inside it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
