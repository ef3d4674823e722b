"""What makes a checkpoint trustworthy: the hash of every file, the manifest that records them, and the
reads that check both. Framework-agnostic; core/checkpoint/store.py writes and finds checkpoints with it.

Nothing trusts a checkpoint for existing: manifest.json records the hash and size of every file, and every
reader checks them before it uses a byte. A file is hashed as it is written (`HashingWriter`), and read back
through the same hash (`stream_verified`; on a local disk the file is memory-mapped and hashed in place,
with no copy into a buffer; from other storage each chunk is hashed on its way to where it goes).

The hash detects corruption, truncation and half-copied files: xxh3_128 by default (about 25 GB/s on one core
here, so verifying costs little next to reading), or SHA-256 (about 1 GB/s) for whoever wants a
cryptographic digest (`hash="sha256"`; TrainConfig.checkpoint_hash). Each file's record names its algorithm
({"xxh3_128": hex, "bytes": n} or {"sha256": hex, "bytes": n}), so checkpoints of either kind, and those of
earlier versions (SHA-256, format_version 1), load alike. A SHA-256 manifest is still written as
format_version 1, which every hvdazure reads; an xxh3_128 one is format_version 2, so that an older hvdazure
refuses it with a clear message instead of misreading it.

Metadata is JSON only, never pickle, so reading a manifest cannot run code. On object stores, each storage
operation is retried on transient errors (`storage_call`, through hvdazure.core.object_store).
"""

from __future__ import annotations

import hashlib
import io
import json
import mmap
import posixpath
import threading
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO, TypeVar

from hvdazure.core.errors import UserError
from hvdazure.core.object_store import is_local, retrying

# The format_version a manifest is written as, by its files' hash: SHA-256 records are what every hvdazure
# reads (version 1); xxh3_128 ones are version 2, which an older hvdazure refuses with a clear message.
FORMAT_BY_HASH = {"xxh3_128": 2, "sha256": 1}
HASHES = tuple(FORMAT_BY_HASH)  # what a file's record may name; the first is the default
FORMAT_VERSION = FORMAT_BY_HASH[HASHES[0]]
READABLE_FORMATS = sorted(set(FORMAT_BY_HASH.values()))
MANIFEST = "manifest.json"
_CHUNK = 4 << 20  # read size when verifying: large enough that the hash and the copy run at memory speed
_PARALLEL_HASH_BYTES = 1 << 20
_T = TypeVar("_T")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing, incomplete or corrupt; the one-line message names it and what is wrong.
    Exit status 1: it may be the storage's fault, not the input's (a save that keeps failing)."""

    exit_status = 1


class CallbackFailed(Exception):
    """A file callback's own exception, carried past the storage retries (which are not for it)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def new_hash(algorithm: str) -> Any:
    """A fresh hash object of one of HASHES (hashlib's interface: update, hexdigest)."""
    if algorithm == "sha256":
        return hashlib.sha256()
    import xxhash  # here, not at the top: `import hvdazure` stays light

    return xxhash.xxh3_128()


class HashingWriter(io.RawIOBase):
    """The binary stream a file callback writes to: passes bytes on to storage, hashing them on the way."""

    def __init__(self, raw: BinaryIO, digest: Any) -> None:
        super().__init__()
        self._raw = raw
        self.digest = digest
        self.bytes = 0
        self.storage_failed = False  # a write to storage raised (not the callback's own code)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if view.nbytes < _PARALLEL_HASH_BYTES:
            self._store(view)
            self.digest.update(view)
        else:  # hash while the bytes are written: both release the GIL, and the buffer does not change
            hashing = threading.Thread(target=self.digest.update, args=(view,))
            hashing.start()
            try:
                self._store(view)
            finally:
                hashing.join()
        self.bytes += view.nbytes
        return view.nbytes

    def _store(self, view: memoryview) -> None:
        try:
            self._raw.write(view)
        except BaseException:
            self.storage_failed = True
            raise

    def tell(self) -> int:
        return self.bytes


def stream_verified(fs: Any, root: str, url: str, manifest: Mapping[str, Any], file_name: str,
                    sink: BinaryIO | None = None) -> None:
    """Read one file of the checkpoint at `url` (stored at `root` on `fs`) through its recorded hash (into
    `sink`, if given) and check it against `manifest`. A file that is not there is a CheckpointError; any
    other failure to open or read it is the storage's error, raised as it is: the checkpoint may be fine,
    and resume must not pass it over."""
    def attempt() -> None:
        if sink is not None:  # an earlier attempt's bytes are not kept
            sink.seek(0)
            sink.truncate()
        _stream_verified_once(fs, root, url, manifest, file_name, sink)

    storage_call(fs, f"reading {url}/{file_name}", attempt)


def _stream_verified_once(fs: Any, root: str, url: str, manifest: Mapping[str, Any], file_name: str,
                          sink: BinaryIO | None) -> None:
    path = posixpath.join(root, file_name)
    algorithm, recorded = _recorded_hash(manifest["files"][file_name])
    try:
        source = fs.open(path, "rb")
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {url}: file {file_name!r} is missing") from None
    with source:
        check_size(url, manifest, file_name, fs.size(path))  # a truncated file fails without being read
        digest = new_hash(algorithm)
        mapped = _mapped(source) if sink is None and is_local(fs) else None
        if mapped is not None:  # hashed where the page cache holds it: no copy into a buffer
            with mapped:
                digest.update(mapped)
                size = len(mapped)
        else:
            size = _copy_through(source, digest, sink)
    check_size(url, manifest, file_name, size)
    if digest.hexdigest() != recorded:
        raise CheckpointError(f"checkpoint {url}: file {file_name!r} does not match its "
                              f"{algorithm} in the manifest (corrupt)")


def _mapped(source: Any) -> mmap.mmap | None:
    """A read-only map of a local file, or None where it cannot be mapped (an empty file; a FUSE mount with
    direct I/O, as blob storage mounts may be, refuses mmap): then it is read in chunks."""
    try:
        mapped = mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    if hasattr(mmap, "MADV_SEQUENTIAL"):  # read ahead from a cold disk
        mapped.madvise(mmap.MADV_SEQUENTIAL)
    return mapped


def _copy_through(source: Any, digest: Any, sink: BinaryIO | None) -> int:
    """Read `source` to its end in chunks into `digest` (and `sink`); the bytes read."""
    size = 0
    buffer = bytearray(_CHUNK)  # one buffer read into again and again: no allocation per chunk
    view = memoryview(buffer)
    while count := source.readinto(buffer):
        chunk = view[:count]
        digest.update(chunk)
        size += count
        if sink is not None:
            sink.write(chunk)
    return size


def _recorded_hash(record: Mapping[str, Any]) -> tuple[str, str]:
    """The algorithm and hex digest a file's manifest record holds (one of HASHES; checked on reading)."""
    algorithm = next(name for name in HASHES if name in record)
    return algorithm, record[algorithm]


def _is_pointer_directory(fs: Any, root: str) -> bool:
    """Whether `root` holds a `latest` pointer: a directory of checkpoints (checkpoint/store.py's LATEST)."""
    try:
        return bool(fs.isfile(posixpath.join(root, "latest")))
    except Exception:  # storage that cannot answer: the plain message
        return False


def read_manifest(fs: Any, root: str, url: str) -> dict[str, Any]:
    """The manifest of the checkpoint at `url` (stored at `root` on `fs`), parsed and checked for its
    shape; CheckpointError if it is missing, not JSON, or malformed."""
    path = posixpath.join(root, MANIFEST)
    try:
        raw = storage_call(fs, f"reading {url}/{MANIFEST}", lambda: fs.cat_file(path))
    except FileNotFoundError:
        if _is_pointer_directory(fs, root):  # resume=DIR where DIR/latest was meant
            raise CheckpointError(f"checkpoint {url}: no {MANIFEST}: it is a directory of checkpoints; "
                                  f"name one of them, or {url.rstrip('/')}/latest for the newest valid one"
                                  ) from None
        raise CheckpointError(f"checkpoint {url}: no {MANIFEST} (not a checkpoint, or its save was "
                              "interrupted)") from None
    try:
        manifest: dict[str, Any] = json.loads(raw)
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
            check_file_name(name)
        except ValueError:
            return f"lists an invalid file name {name!r}"
        if not (isinstance(record, dict) and isinstance(record.get("bytes"), int)):
            return f"has a malformed entry for file {name!r}"
        known = [algorithm for algorithm in HASHES if algorithm in record]
        if len(known) != 1 or not isinstance(record[known[0]], str):
            others = sorted(set(record) - {"bytes"})
            return (f"records no hash this hvdazure knows for file {name!r} ({', '.join(others) or 'none'}; "
                    f"known: {', '.join(HASHES)})")
    return None


def check_format(url: str, manifest: Mapping[str, Any]) -> None:
    """CheckpointError unless the manifest's format_version is one this hvdazure reads."""
    version = manifest.get("format_version")
    if isinstance(version, bool) or version not in READABLE_FORMATS:
        raise CheckpointError(f"checkpoint {url}: format_version {version!r} is not one this "
                              f"hvdazure reads ({', '.join(map(str, READABLE_FORMATS))})")


def check_size(url: str, manifest: Mapping[str, Any], file_name: str, size: int) -> None:
    """CheckpointError unless `size` is the size the manifest records for `file_name`."""
    recorded = manifest["files"][file_name]["bytes"]
    if size != recorded:
        raise CheckpointError(f"checkpoint {url}: file {file_name!r} has {size} bytes, the "
                              f"manifest says {recorded} (truncated?)")


def check_file_name(name: str) -> None:
    """A plain file name inside the checkpoint directory: no path, and not the manifest itself."""
    if not name or name in (".", "..", MANIFEST) or "/" in name or "\\" in name:
        raise ValueError(f"invalid checkpoint file name {name!r}")


def storage_call(fs: Any, what: str, call: Callable[[], _T]) -> _T:
    """call(): on a local filesystem as it is; on other storage retried on transient errors, and failing
    with one StorageError line otherwise (FileNotFoundError and CheckpointError pass unchanged).

    Each attempt forgets the listings fsspec keeps (adlfs's dircache): another process may have written or
    deleted checkpoints since, and a stale listing would hide the checkpoint `latest` names."""
    if is_local(fs):
        return call()

    def fresh() -> _T:
        fs.invalidate_cache()
        return call()

    return retrying(what, fresh, passes=(CheckpointError, CallbackFailed))
