"""Checkpoints in storage: written atomically, verified before use, pruned by policy. Framework-agnostic.

Only rank 0 uses a CheckpointManager and it runs no collectives; the trainer binding decides what goes into
the files and the manifest. The layout of a checkpoint directory:

    step-00000120/              one checkpoint: the binding's files, then manifest.json
        model.pt
        manifest.json           the binding's metadata + format_version, step, created, files (sha256, bytes)
    latest                      the name of the newest checkpoint ("step-00000120")
    .tmp-step-00000130-<uuid>/  a save in progress, or left by a writer that was killed (cleanup_temporaries)

A save writes every file into a temporary directory, then manifest.json, fsyncs them (on local disks),
renames the directory into place, and only then replaces `latest` (a temporary file renamed over it). On a
local filesystem the rename is atomic: a checkpoint directory is complete or absent. Object stores (abfs://
on Azure, through adlfs) have no directory rename: fsspec copies object by object, in no guaranteed order,
then deletes the source, so a copy interrupted half-way can leave a directory with a manifest and missing
or partial files. That is why nothing trusts a directory for existing: manifest.json records the sha256 and
size of every file, verification checks them all, and `latest_valid` skips (with a warning naming it) a
checkpoint that is truncated, corrupt or half-written, falling back to the previous one.

Metadata is JSON only, never pickle, so reading a manifest cannot run code. All storage goes through fsspec
(imported on first use, so `import hvdazure` stays fast): local paths, file://, memory:// and abfs:// share
one code path.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import posixpath
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, BinaryIO

from hvdazure.core.rank_logging import logger

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
LATEST = "latest"
_TMP_PREFIX = ".tmp-"
_STEP_NAME = re.compile(r"step-(\d+)")
_RESERVED_KEYS = ("format_version", "step", "created", "files")  # the manager writes these itself
_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt; the one-line message names it and what is wrong."""


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint found in storage."""

    name: str  # "step-00000120": zero-padded so that names sort by step
    url: str  # full path or URL of its directory
    manifest: dict[str, Any]  # parsed manifest.json

    @property
    def step(self) -> int:
        return self.manifest["step"]


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint of optimizer step `step`."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    return f"step-{step:08d}"


class CheckpointManager:
    """Saves, finds, verifies and prunes the checkpoints in one directory (a local path or fsspec URL).

    After each save it keeps the newest `keep_last` checkpoints, plus the best `keep_best` by
    manifest["metrics"][monitor] (lowest for mode "min", highest for "max"), and deletes the rest.
    """

    def __init__(self, directory: str, keep_last: int = 3, keep_best: int = 0, monitor: str | None = None,
                 mode: str = "min") -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        if keep_best < 0:
            raise ValueError(f"keep_best must be 0 or more, got {keep_best}")
        if keep_best > 0 and monitor is None:
            raise ValueError(f"keep_best={keep_best} needs a monitor: the metric that ranks checkpoints")
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.directory = directory.rstrip("/") or directory
        self.keep_last, self.keep_best, self.monitor, self.mode = keep_last, keep_best, monitor, mode
        self._fs, self._root = _url_to_fs(self.directory)
        self._local = _is_local(self._fs)

    # --- saving ------------------------------------------------------------------------------------------
    def save(self, step: int, files: Mapping[str, Callable[[BinaryIO], None]],
             manifest: Mapping[str, Any]) -> Checkpoint:
        """Write one checkpoint: each callback writes one file's bytes to the binary file object it is given.

        The bytes are hashed as they pass through, so nothing is held twice in memory. Then manifest.json,
        the rename into place (replacing an earlier save of the same step), `latest`, and retention.
        """
        name = checkpoint_name(step)
        for file_name in files:
            _check_file_name(file_name)
        if clash := [key for key in _RESERVED_KEYS if key in manifest]:
            raise ValueError(f"manifest keys {clash} are written by the checkpoint manager; rename them")
        try:
            json.dumps(dict(manifest))  # fail before writing anything
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the manifest of {name} is not JSON: {exc}") from None

        tmp = self._path(f"{_TMP_PREFIX}{name}-{uuid.uuid4().hex}")
        self._fs.makedirs(tmp, exist_ok=True)
        try:
            records = {file_name: self._write(posixpath.join(tmp, file_name), write)
                       for file_name, write in files.items()}
            full = {**manifest, "format_version": FORMAT_VERSION, "step": step,
                    "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "files": records}
            text = json.dumps(full, indent=2).encode()
            self._write(posixpath.join(tmp, MANIFEST), lambda f: f.write(text))
            if self._local:
                _fsync(tmp)
            self._move_into_place(tmp, name)
        except BaseException:
            self._delete(tmp)
            raise
        self._write_latest(name)
        self._apply_retention(name)
        return Checkpoint(name, self._url(name), full)

    def _write(self, path: str, write: Callable[[BinaryIO], None]) -> dict[str, Any]:
        with self._fs.open(path, "wb") as raw:
            out = _HashingWriter(raw)
            write(out)  # type: ignore[arg-type]
            raw.flush()
            if self._local:
                os.fsync(raw.fileno())
        return {"sha256": out.sha256.hexdigest(), "bytes": out.bytes}

    def _move_into_place(self, tmp: str, name: str) -> None:
        final = self._path(name)
        aside = None
        if self._fs.exists(final):  # a re-save of this step: move the old one aside, not into the new one
            aside = f"{tmp}.old"  # a .tmp- name: cleanup_temporaries removes it if we die before we do
            self._fs.mv(final, aside, recursive=True)
        try:
            self._fs.mv(tmp, final, recursive=True)
        except BaseException:
            if aside is not None and not self._fs.exists(final):
                self._fs.mv(aside, final, recursive=True)
            raise
        if self._local:
            _fsync(self._root)
        if aside is not None:
            self._delete(aside)

    def _write_latest(self, name: str) -> None:
        tmp = self._path(f"{_TMP_PREFIX}{LATEST}-{uuid.uuid4().hex}")
        self._write(tmp, lambda f: f.write(f"{name}\n".encode()))
        self._fs.mv(tmp, self._path(LATEST))
        if self._local:
            _fsync(self._root)

    def _apply_retention(self, just_written: str) -> None:
        """Keep the newest keep_last and best keep_best; delete every other step-* directory.

        `latest` names the checkpoint just written, which is always kept. Unreadable directories (an
        interrupted save) are not counted among the newest and are deleted.
        """
        try:
            by_step = self.checkpoints()
            keep = {c.name for c in by_step[-self.keep_last:]} | {just_written}
            keep |= {c.name for c in self._by_metric(by_step)[:self.keep_best]}
            doomed = [name for name in self._step_names() if name not in keep]
        except Exception as exc:  # the checkpoint is safely written; pruning can wait for the next save
            logger.warning(f"checkpoint retention in {self.directory} skipped: {exc}")
            return
        for name in doomed:
            self._delete(self._path(name))

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
        """The newest checkpoint that verifies: the one `latest` names, else the others newest first.

        Each invalid one skipped adds a warning naming it and why. (None, warnings) if none is valid.
        """
        checkpoint, _, warnings = self.read_latest_valid()
        return checkpoint, warnings

    def read_latest_valid(self) -> tuple[Checkpoint | None, dict[str, bytes], list[str]]:
        """As latest_valid, also returning the verified files: each is read once (for a resume)."""
        warnings: list[str] = []
        names = self._step_names()
        pointed = self._read_latest()
        if pointed is not None and pointed not in names:
            warnings.append(f"`latest` in {self.directory} names {pointed!r}, which is not a checkpoint")
            pointed = None
        order = ([pointed] if pointed else []) + [n for n in reversed(names) if n != pointed]
        for name in order:
            try:
                checkpoint = self._load(name)
                return checkpoint, self.read_files(checkpoint), warnings
            except CheckpointError as exc:
                warnings.append(f"skipping invalid {exc}")
        return None, {}, warnings

    def best(self) -> Checkpoint | None:
        """The best checkpoint by manifest["metrics"][monitor] (not verified); None without a monitor."""
        if self.monitor is None:
            return None
        ranked = self._by_metric(self.checkpoints())
        return ranked[0] if ranked else None

    def open(self, path: str, verify: bool = True) -> Checkpoint:
        """The checkpoint in directory `path` (a path or URL), verified unless `verify` is False (for a
        caller about to read_files, which verifies as it reads); CheckpointError if it is invalid."""
        fs, root = _url_to_fs(path)
        url = path.rstrip("/")
        checkpoint = Checkpoint(posixpath.basename(root.rstrip("/")), url, _read_manifest(fs, root, url))
        if verify:
            self.verify(checkpoint)
        return checkpoint

    def resolve(self, which: str) -> Checkpoint:
        """The checkpoint `which` names: "latest" (newest valid), "best" (best that verifies) or a path."""
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
            for checkpoint in self._by_metric(self.checkpoints()):
                try:
                    self.verify(checkpoint)
                    return checkpoint
                except CheckpointError as exc:
                    logger.warning(f"skipping invalid {exc}")
            raise CheckpointError(f"no valid checkpoint in {self.directory} has the metric {self.monitor!r}")
        return self.open(which)

    def _step_names(self) -> list[str]:
        names = [name for name, kind in self._entries() if kind == "directory" and _STEP_NAME.fullmatch(name)]
        return sorted(names, key=lambda name: int(name.removeprefix("step-")))

    def _entries(self) -> list[tuple[str, str]]:
        try:
            listing = self._fs.ls(self._root, detail=True)
        except FileNotFoundError:
            return []
        return [(posixpath.basename(entry["name"].rstrip("/")), entry["type"]) for entry in listing]

    def _load(self, name: str) -> Checkpoint:
        url = self._url(name)
        return Checkpoint(name, url, _read_manifest(self._fs, self._path(name), url))

    def _read_latest(self) -> str | None:
        try:
            return self._fs.cat_file(self._path(LATEST)).decode(errors="replace").strip()
        except FileNotFoundError:
            return None

    def _by_metric(self, checkpoints: list[Checkpoint]) -> list[Checkpoint]:
        """Checkpoints that have the monitored metric, best first; on a tie the newer one first."""
        sign = 1 if self.mode == "min" else -1
        scored = [(value, c) for c in checkpoints if (value := self._metric(c)) is not None]
        return [c for _, c in sorted(scored, key=lambda vc: (sign * vc[0], -vc[1].step))]

    def _metric(self, checkpoint: Checkpoint) -> float | None:
        metrics = checkpoint.manifest.get("metrics")
        value = metrics.get(self.monitor) if isinstance(metrics, dict) and self.monitor else None
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            return None
        return float(value)

    # --- verifying ---------------------------------------------------------------------------------------
    def verify(self, checkpoint: Checkpoint) -> None:
        """CheckpointError unless every listed file is there with its recorded size and sha256 (streamed)."""
        _check_format(checkpoint)
        fs, root = _url_to_fs(checkpoint.url)
        for file_name, record in checkpoint.manifest["files"].items():
            path = posixpath.join(root, file_name)
            try:
                size = fs.size(path)
            except FileNotFoundError:
                raise CheckpointError(f"checkpoint {checkpoint.url}: file {file_name!r} is missing") from None
            digest = hashlib.sha256()
            if size == record["bytes"]:  # a truncated file fails below without reading it
                with fs.open(path, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        digest.update(chunk)
            _check_file(checkpoint, file_name, size, digest.hexdigest())

    def read_files(self, checkpoint: Checkpoint) -> dict[str, bytes]:
        """Every listed file's bytes, each read once and verified; CheckpointError on a mismatch."""
        _check_format(checkpoint)
        fs, root = _url_to_fs(checkpoint.url)
        contents = {}
        for file_name in checkpoint.manifest["files"]:
            try:
                data = fs.cat_file(posixpath.join(root, file_name))
            except FileNotFoundError:
                raise CheckpointError(f"checkpoint {checkpoint.url}: file {file_name!r} is missing") from None
            _check_file(checkpoint, file_name, len(data), hashlib.sha256(data).hexdigest())
            contents[file_name] = data
        return contents

    # --- cleaning up -------------------------------------------------------------------------------------
    def cleanup_temporaries(self) -> list[str]:
        """Remove what an interrupted save left behind (.tmp-* entries); returns their names."""
        return [name for name, _ in self._entries()
                if name.startswith(_TMP_PREFIX) and self._delete(self._path(name))]

    def _delete(self, path: str) -> bool:
        try:
            if self._fs.exists(path):
                self._fs.rm(path, recursive=True)
            return True
        except Exception as exc:  # storage errors differ by backend; a leftover is only wasted space
            logger.warning(f"could not delete {path} from {self.directory}: {exc}")
            return False

    def _path(self, name: str) -> str:
        return posixpath.join(self._root, name)

    def _url(self, name: str) -> str:
        return f"{self.directory}/{name}"


_PARALLEL_HASH_BYTES = 1 << 20


class _HashingWriter(io.RawIOBase):
    """The binary stream a file callback writes to: passes bytes on to storage, hashing them on the way."""

    def __init__(self, raw: BinaryIO) -> None:
        super().__init__()
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes < _PARALLEL_HASH_BYTES:
            self._raw.write(view)
            self.sha256.update(view)
        else:  # hash while the bytes are written: both release the GIL, and the buffer does not change
            hashing = threading.Thread(target=self.sha256.update, args=(view,))
            hashing.start()
            try:
                self._raw.write(view)
            finally:
                hashing.join()
        self.bytes += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.bytes


def _read_manifest(fs: Any, root: str, url: str) -> dict[str, Any]:
    try:
        raw = fs.cat_file(posixpath.join(root, MANIFEST))
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {url}: no {MANIFEST} (not a checkpoint, or its save was "
                              "interrupted)") from None
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise CheckpointError(f"checkpoint {url}: {MANIFEST} is not valid JSON ({exc})") from None
    if problem := _manifest_problem(manifest):
        raise CheckpointError(f"checkpoint {url}: {MANIFEST} {problem}")
    return manifest


def _manifest_problem(manifest: Any) -> str | None:
    if not isinstance(manifest, dict):
        return "is not a JSON object"
    step = manifest.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return "has no integer 'step'"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "has no 'files' table"
    for name, record in files.items():
        try:
            _check_file_name(name)
        except ValueError:
            return f"lists an invalid file name {name!r}"
        if not (isinstance(record, dict) and isinstance(record.get("sha256"), str)
                and isinstance(record.get("bytes"), int)):
            return f"has a malformed entry for file {name!r}"
    return None


def _check_format(checkpoint: Checkpoint) -> None:
    version = checkpoint.manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {checkpoint.url}: format_version {version!r} is not one this "
                              f"hvdazure reads ({FORMAT_VERSION})")


def _check_file(checkpoint: Checkpoint, file_name: str, size: int, sha256: str) -> None:
    record = checkpoint.manifest["files"][file_name]
    where = f"checkpoint {checkpoint.url}: file {file_name!r}"
    if size != record["bytes"]:
        raise CheckpointError(f"{where} has {size} bytes, the manifest says {record['bytes']} (truncated?)")
    if sha256 != record["sha256"]:
        raise CheckpointError(f"{where} does not match its sha256 in the manifest (corrupt)")


def _check_file_name(name: str) -> None:
    """A plain file name inside the checkpoint directory: no path, and not the manifest itself."""
    if not name or name in (".", "..", MANIFEST) or "/" in name or "\\" in name:
        raise ValueError(f"invalid checkpoint file name {name!r}")


def _url_to_fs(url: str) -> tuple[Any, str]:
    import fsspec  # here, not at the top: `import hvdazure` stays fast

    return fsspec.core.url_to_fs(url)


def _is_local(fs: Any) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return bool({"file", "local"} & set(protocols))


def _fsync(path: str) -> None:
    """Flush a local file's or directory's entry to disk (a directory: the renames inside it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
