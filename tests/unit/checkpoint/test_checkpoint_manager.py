"""hvdazure.core.checkpoint.store: atomic, verified checkpoints on local paths and fsspec URLs; retention.

Every storage test runs three times: on a local directory, on a memory:// URL (fsspec's in-process store,
which has directories), and on abfs:// in a container of Azurite, a real flat-namespace Blob endpoint
(tests/storage/azurite.py; skipped, saying why, only where Node.js cannot be had).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import posixpath
import subprocess
import sys
import uuid
import zipfile
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import fsspec
import pytest
import xxhash
from storage.azurite import azurite, blob_url  # noqa: F401  (fixtures, for the "blob" storage)

from hvdazure.core.checkpoint.store import (
    FORMAT_VERSION,
    CheckpointError,
    CheckpointManager,
    pointer_directory,
)
from hvdazure.core.checkpoint.weights import exported_file


@pytest.fixture(params=["local", "memory", pytest.param("blob", marks=pytest.mark.storage)])
def root(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[str]:
    if request.param == "local":
        yield str(tmp_path / "checkpoints")
        return
    if request.param == "blob":
        yield f"{request.getfixturevalue('blob_url')}/checkpoints"
        return
    url = f"memory://ckpt-{uuid.uuid4().hex}"
    yield url
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def _weights(step: int) -> bytes:
    return bytes(range(256)) * 8 + f"step {step}".encode()


def _save(manager: CheckpointManager, step: int, **metrics: float) -> Any:
    files = {"model.bin": lambda f: f.write(_weights(step)),
             "state.json": lambda f: f.write(json.dumps({"step": step}).encode())}
    return manager.save(step, files, {"metrics": metrics, "framework": "test"})


def _listing(url: str) -> set[str]:
    fs, path = fsspec.core.url_to_fs(url)
    return {posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)}


def _cat(url: str) -> bytes:
    fs, path = fsspec.core.url_to_fs(url)
    return fs.cat_file(path)


def _pipe(url: str, data: bytes) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    fs.pipe_file(path, data)


def _rm(url: str) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    fs.rm(path)


def _flip_a_bit(url: str) -> None:
    data = bytearray(_cat(url))
    data[100] ^= 1
    _pipe(url, bytes(data))


# Each damages the checkpoint directory it is given; the string is what the error must name.
CORRUPTIONS: dict[str, tuple[Callable[[str], None], str]] = {
    "truncated file": (lambda d: _pipe(f"{d}/model.bin", _cat(f"{d}/model.bin")[:1000]), "model.bin"),
    "flipped bit": (lambda d: _flip_a_bit(f"{d}/model.bin"), "model.bin"),
    "missing file": (lambda d: _rm(f"{d}/model.bin"), "model.bin"),
    "missing manifest (half-written)": (lambda d: _rm(f"{d}/manifest.json"), "manifest.json"),
    "garbage manifest": (lambda d: _pipe(f"{d}/manifest.json", b'{"step": 2, "fil'), "manifest.json"),
}


# --- saving ----------------------------------------------------------------------------------------------
def test_save_then_read_files_returns_the_written_bytes(root: str) -> None:
    manager = CheckpointManager(root)
    checkpoint = _save(manager, 120)

    assert checkpoint.name == "step-00000120"
    assert checkpoint.url == f"{root}/step-00000120"
    assert manager.read_files(checkpoint) == {"model.bin": _weights(120), "state.json": b'{"step": 120}'}


def test_manifest_records_format_version_step_created_and_each_files_hash_and_size(root: str) -> None:
    checkpoint = _save(CheckpointManager(root), 7, eval_loss=0.25)
    manifest = json.loads(_cat(f"{root}/step-00000007/manifest.json"))

    assert manifest == checkpoint.manifest
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["step"] == checkpoint.step == 7
    assert manifest["metrics"] == {"eval_loss": 0.25} and manifest["framework"] == "test"
    created = datetime.fromisoformat(manifest["created"])
    assert created.utcoffset() == timedelta(0)
    assert abs(datetime.now(timezone.utc) - created) < timedelta(minutes=1)
    state = b'{"step": 7}'
    assert manifest["files"] == {
        "model.bin": {"xxh3_128": xxhash.xxh3_128(_weights(7)).hexdigest(), "bytes": len(_weights(7))},
        "state.json": {"xxh3_128": xxhash.xxh3_128(state).hexdigest(), "bytes": len(state)},
    }


def test_sha256_on_request_is_recorded_as_format_version_1_which_earlier_versions_read(root: str) -> None:
    checkpoint = _save(CheckpointManager(root, hash="sha256"), 7)

    assert checkpoint.manifest["format_version"] == 1
    assert checkpoint.manifest["files"]["model.bin"] == {"sha256": hashlib.sha256(_weights(7)).hexdigest(),
                                                         "bytes": len(_weights(7))}
    assert CheckpointManager(root).read_files(checkpoint)["model.bin"] == _weights(7)


def test_a_checkpoint_of_an_earlier_version_with_sha256_records_still_loads(root: str) -> None:
    # What hvdazure wrote before xxh3_128: format_version 1, {"sha256", "bytes"} records, keys in this order.
    files = {"model.bin": _weights(3), "state.json": b'{"step": 3}'}
    manifest = {"framework": "test", "metrics": {}, "format_version": 1, "step": 3,
                "created": "2026-11-01T10:00:00+00:00",
                "files": {name: {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
                          for name, data in files.items()}}
    for name, data in {**files, "manifest.json": json.dumps(manifest, indent=2).encode()}.items():
        _pipe(f"{root}/step-00000003/{name}", data)
    _pipe(f"{root}/latest", b"step-00000003\n")
    manager = CheckpointManager(root)

    with manager.open_latest_valid() as (checkpoint, paths, warnings):
        assert checkpoint is not None and checkpoint.step == 3 and warnings == []
        assert set(paths) == set(files)
    assert manager.read_files(checkpoint) == files
    _flip_a_bit(f"{root}/step-00000003/model.bin")
    with pytest.raises(CheckpointError, match=r"'model\.bin' does not match its sha256"):
        manager.read_files(checkpoint)


def test_a_record_without_a_known_hash_is_one_line_naming_the_file_and_what_it_has(root: str) -> None:
    manifest = _save(CheckpointManager(root), 2).manifest
    manifest["files"]["model.bin"] = {"blake3": "00", "bytes": len(_weights(2))}
    _pipe(f"{root}/step-00000002/manifest.json", json.dumps(manifest).encode())

    with pytest.raises(CheckpointError, match=r"no hash this hvdazure knows for file 'model\.bin' \(blake3; "
                                              r"known: xxh3_128, sha256\)") as error:
        CheckpointManager(root).open(f"{root}/step-00000002")
    assert "\n" not in str(error.value)


def test_an_unknown_hash_choice_is_refused_before_anything_is_written(root: str) -> None:
    with pytest.raises(ValueError, match="hash must be one of xxh3_128, sha256, got 'md5'"):
        CheckpointManager(root, hash="md5")


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_large_writes_hashed_alongside_the_write_give_the_right_hash(root: str, algorithm: str) -> None:
    chunks = [os.urandom(3 << 20), b"small", os.urandom(2 << 20)]  # big writes take the parallel path

    def write(file: Any) -> None:
        for chunk in chunks:
            file.write(chunk)

    checkpoint = CheckpointManager(root, hash=algorithm).save(1, {"big.bin": write}, {})
    data = b"".join(chunks)
    expected = hashlib.sha256(data) if algorithm == "sha256" else xxhash.xxh3_128(data)
    assert checkpoint.manifest["files"]["big.bin"] == {algorithm: expected.hexdigest(), "bytes": len(data)}
    assert CheckpointManager(root).read_files(checkpoint)["big.bin"] == data


def test_on_durable_is_called_when_latest_names_the_complete_checkpoint_before_retention_deletes(
        root: str) -> None:
    manager = CheckpointManager(root, keep_last=1)
    _save(manager, 1)
    seen = []

    def durable(checkpoint: Any) -> None:
        seen.append((checkpoint.name, _cat(f"{root}/latest"), _listing(root)))
        assert manager.read_files(checkpoint)["model.bin"] == _weights(2)

    saved = manager.save(2, {"model.bin": lambda f: f.write(_weights(2))}, {}, on_durable=durable)

    assert seen == [("step-00000002", b"step-00000002\n", {"step-00000001", "step-00000002", "latest"})]
    assert saved.name == "step-00000002" and _listing(root) == {"step-00000002", "latest"}


def test_latest_names_the_newest_checkpoint(root: str) -> None:
    manager = CheckpointManager(root)
    _save(manager, 10)
    _save(manager, 20)

    assert _cat(f"{root}/latest").decode().strip() == "step-00000020"
    checkpoint, warnings = manager.latest_valid()
    assert (checkpoint.name, warnings) == ("step-00000020", [])


def test_a_writer_that_writes_through_zipfile_produces_a_valid_file(root: str) -> None:
    # torch.save and numpy write archives like this: through tell() and write() on a non-seekable stream
    def write_zip(f: Any) -> None:
        with zipfile.ZipFile(f, "w") as archive:
            archive.writestr("tensor", b"\x00" * 5000)

    manager = CheckpointManager(root)
    checkpoint = manager.save(1, {"model.zip": write_zip}, {})

    data = manager.read_files(manager.open(checkpoint.url))["model.zip"]
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.read("tensor") == b"\x00" * 5000


def test_resaving_a_step_replaces_it_with_a_new_version(root: str) -> None:
    manager = CheckpointManager(root)
    _save(manager, 5)
    checkpoint = manager.save(5, {"model.bin": lambda f: f.write(b"new weights")}, {"reason": "again"})

    assert checkpoint.name == "step-00000005-v2" and checkpoint.step == 5
    assert _listing(root) == {"step-00000005-v2", "latest"}
    assert _cat(f"{root}/latest").decode().strip() == "step-00000005-v2"
    assert manager.read_files(checkpoint) == {"model.bin": b"new weights"}
    assert [c.manifest["reason"] for c in manager.checkpoints()] == ["again"]


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint_latest(root: str) -> None:
    manager = CheckpointManager(root)
    _save(manager, 1)

    def crash(f: Any) -> None:
        f.write(b"half a model")
        raise RuntimeError("out of disk")

    with pytest.raises(RuntimeError, match="out of disk"):
        manager.save(2, {"model.bin": crash}, {})
    assert _listing(root) == {"step-00000001", "latest"}
    assert manager.latest_valid()[0].name == "step-00000001"


@pytest.mark.parametrize(("manifest", "files", "match"), [
    ({"step": 3}, {"a": lambda f: None}, "'step'"),
    ({}, {"sub/a.bin": lambda f: None}, "'sub/a.bin'"),
    ({}, {"manifest.json": lambda f: None}, "'manifest.json'"),
    ({"when": datetime.now()}, {}, "not JSON"),
])
def test_save_rejects_reserved_keys_path_like_names_and_non_json_metadata(
        root: str, manifest: dict[str, Any], files: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        CheckpointManager(root).save(3, files, manifest)


# --- finding and verifying -------------------------------------------------------------------------------
@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_latest_valid_skips_an_invalid_checkpoint_with_a_warning_and_returns_the_previous(
        root: str, corruption: str) -> None:
    manager = CheckpointManager(root)
    _save(manager, 1)
    _save(manager, 2)
    damage, _ = CORRUPTIONS[corruption]
    damage(f"{root}/step-00000002")

    checkpoint, warnings = manager.latest_valid()

    assert checkpoint.name == "step-00000001"
    assert len(warnings) == 1 and "step-00000002" in warnings[0]


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_open_of_a_corrupt_checkpoint_raises_naming_it_and_the_file(root: str, corruption: str) -> None:
    manager = CheckpointManager(root)
    _save(manager, 2)
    damage, culprit = CORRUPTIONS[corruption]
    damage(f"{root}/step-00000002")

    with pytest.raises(CheckpointError, match=culprit) as error:
        manager.open(f"{root}/step-00000002")
    assert "step-00000002" in str(error.value) and "\n" not in str(error.value)


def test_read_files_rejects_bytes_that_do_not_match_the_manifest(root: str) -> None:
    manager = CheckpointManager(root)
    checkpoint = _save(manager, 2)
    _flip_a_bit(f"{root}/step-00000002/model.bin")

    with pytest.raises(CheckpointError, match=r"'model\.bin' does not match its xxh3_128"):
        manager.read_files(checkpoint)


def test_an_unknown_format_version_does_not_verify(root: str) -> None:
    manager = CheckpointManager(root)
    manifest = _save(manager, 2).manifest
    _pipe(f"{root}/step-00000002/manifest.json", json.dumps({**manifest, "format_version": 99}).encode())

    with pytest.raises(CheckpointError, match="format_version 99"):
        manager.open(f"{root}/step-00000002")


def test_a_latest_pointer_naming_no_checkpoint_falls_back_to_the_newest_with_a_warning(root: str) -> None:
    manager = CheckpointManager(root)
    _save(manager, 1)
    _save(manager, 2)
    _pipe(f"{root}/latest", b"../elsewhere")

    checkpoint, warnings = manager.latest_valid()

    assert checkpoint.name == "step-00000002"
    assert len(warnings) == 1 and "'../elsewhere'" in warnings[0]


def test_a_leftover_temporary_directory_is_ignored_then_removed(root: str) -> None:
    manager = CheckpointManager(root)
    _save(manager, 1)
    leftover = ".tmp-step-00000002-0123abcd"  # what a writer killed mid-save leaves
    _pipe(f"{root}/{leftover}/model.bin", b"half")
    _pipe(f"{root}/{leftover}/manifest.json", _cat(f"{root}/step-00000001/manifest.json"))

    assert [c.name for c in manager.checkpoints()] == ["step-00000001"]
    assert manager.latest_valid() == (manager.checkpoints()[0], [])
    assert manager.cleanup_temporaries() == [leftover]
    assert _listing(root) == {"step-00000001", "latest"}


def test_an_empty_directory_has_no_checkpoints(root: str) -> None:
    manager = CheckpointManager(root)

    assert manager.checkpoints() == []
    assert manager.latest_valid() == (None, [])
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        manager.resolve("latest")


# --- retention -------------------------------------------------------------------------------------------
def test_keep_last_2_leaves_exactly_the_2_newest(root: str) -> None:
    manager = CheckpointManager(root, keep_last=2)
    for step in range(1, 6):
        _save(manager, step)

    assert _listing(root) == {"step-00000004", "step-00000005", "latest"}


def test_keep_best_keeps_the_lowest_eval_loss_plus_the_last_k(root: str) -> None:
    manager = CheckpointManager(root, keep_last=2, keep_best=1, monitor="eval_loss", mode="min")
    for step, loss in enumerate([0.5, 0.2, 0.4, 0.3, 0.6], start=1):
        _save(manager, step, eval_loss=loss)

    assert _listing(root) == {"step-00000002", "step-00000004", "step-00000005", "latest"}
    assert manager.best().name == "step-00000002"


def test_mode_max_keeps_the_highest_metric(root: str) -> None:
    manager = CheckpointManager(root, keep_last=1, keep_best=2, monitor="eval_accuracy", mode="max")
    for step, accuracy in enumerate([0.5, 0.9, 0.4, 0.8, 0.6], start=1):
        _save(manager, step, eval_accuracy=accuracy)

    assert _listing(root) == {"step-00000002", "step-00000004", "step-00000005", "latest"}
    assert manager.best().name == "step-00000002"


def test_a_tie_on_the_metric_keeps_the_newer_checkpoint(root: str) -> None:
    manager = CheckpointManager(root, keep_last=1, keep_best=1, monitor="eval_loss")
    for step, loss in enumerate([0.2, 0.2, 0.5, 0.6], start=1):
        _save(manager, step, eval_loss=loss)

    assert _listing(root) == {"step-00000002", "step-00000004", "latest"}


def test_checkpoints_without_the_metric_are_not_candidates_for_best(root: str) -> None:
    manager = CheckpointManager(root, keep_last=1, keep_best=1, monitor="eval_loss")
    _save(manager, 1, eval_loss=0.9)
    _save(manager, 2, train_loss=0.1)
    _save(manager, 3, eval_loss=float("nan"))

    assert manager.best().name == "step-00000001"
    assert _listing(root) == {"step-00000001", "step-00000003", "latest"}


# --- resolving -------------------------------------------------------------------------------------------
def test_resolve_finds_latest_best_and_an_explicit_path(root: str) -> None:
    manager = CheckpointManager(root, keep_last=3, monitor="eval_loss")
    for step, loss in enumerate([0.3, 0.1, 0.2], start=1):
        _save(manager, step, eval_loss=loss)

    assert manager.resolve("latest").name == "step-00000003"
    assert manager.resolve("best").name == "step-00000002"
    assert manager.resolve(f"{root}/step-00000001/").name == "step-00000001"
    with pytest.raises(CheckpointError, match="step-00000009"):
        manager.resolve(f"{root}/step-00000009")


def test_best_without_the_monitored_metric_names_what_the_checkpoints_record(root: str) -> None:
    manager = CheckpointManager(root, keep_last=3, monitor="eval_loss")
    _save(manager, 1, eval_accuracy=0.8)
    _save(manager, 2, eval_accuracy=0.9, train_loss=0.1)

    expected = (r"^no valid checkpoint in .* has the metric 'eval_loss' \(the run's monitor; its checkpoints "
                r"record eval_accuracy, train_loss\): take 'latest' or a checkpoint's path, or train with "
                r"monitor set to a metric validation_step returns$")
    with pytest.raises(CheckpointError, match=expected):
        manager.resolve("best")
    with pytest.raises(CheckpointError, match=expected), manager.open_valid("best", ["model.pt"]):
        pass


def test_resolve_best_skips_a_corrupt_best_and_needs_a_monitor(root: str) -> None:
    manager = CheckpointManager(root, monitor="eval_loss")
    _save(manager, 1, eval_loss=0.3)
    _save(manager, 2, eval_loss=0.1)
    _flip_a_bit(f"{root}/step-00000002/model.bin")

    assert manager.resolve("best").name == "step-00000001"
    with pytest.raises(CheckpointError, match="monitor"):
        CheckpointManager(root).resolve("best")


# --- runs: one directory, one run ------------------------------------------------------------------------
def test_each_save_records_the_writer_s_run_id(root: str) -> None:
    _save(CheckpointManager(root, run_id="run-a"), 1)

    assert [c.run_id for c in CheckpointManager(root).checkpoints()] == ["run-a"]
    assert json.loads(_cat(f"{root}/step-00000001/manifest.json"))["run_id"] == "run-a"


def test_retention_never_counts_or_deletes_another_run_s_checkpoints(root: str) -> None:
    first = CheckpointManager(root, keep_last=2, run_id="run-a")
    for step in range(3, 6):
        _save(first, step)  # keeps 4 and 5
    second = CheckpointManager(root, keep_last=2, run_id="run-b")
    for step in range(1, 5):
        _save(second, step)  # its step 4 is a new version beside run-a's

    by_run = {(c.run_id, c.name) for c in CheckpointManager(root).checkpoints()}
    assert by_run == {("run-a", "step-00000004"), ("run-a", "step-00000005"),
                      ("run-b", "step-00000003"), ("run-b", "step-00000004-v2")}


def _save_monitored(manager: CheckpointManager, step: int, eval_loss: float) -> None:
    """A checkpoint as the trainer writes it: the config (its monitor) in the manifest, for load_weights."""
    manager.save(step, {"state.json": lambda f: f.write(json.dumps({"step": step}).encode())},
                 {"metrics": {"eval_loss": eval_loss}, "config": {"monitor": "eval_loss"}})


def test_latest_and_best_stay_within_the_run_latest_names(root: str) -> None:
    first = CheckpointManager(root, keep_last=5, run_id="run-a")
    for step, loss in [(10, 0.01), (20, 0.02)]:
        _save_monitored(first, step, eval_loss=loss)  # the better model, of another run
    second = CheckpointManager(root, keep_last=5, run_id="run-b")
    for step, loss in [(1, 0.5), (2, 0.4)]:
        _save_monitored(second, step, eval_loss=loss)
    _pipe(f"{root}/step-00000002/state.json", b"{}")  # run-b's newest is damaged

    reader = CheckpointManager(root, monitor="eval_loss")
    assert reader.best().name == "step-00000002"
    assert reader.resolve("best").name == "step-00000001"  # not run-a's step 10
    assert reader.resolve("latest").name == "step-00000001"  # not run-a's step 20
    with exported_file(root, "best", "state.json") as path, open(path, "rb") as file:
        assert json.loads(file.read()) == {"step": 1}


def test_checkpoints_without_a_run_id_count_with_any_run(root: str) -> None:
    legacy = CheckpointManager(root, keep_last=5)
    for step in (1, 2):
        _save(legacy, step, eval_loss=0.1 * step)  # as an hvdazure from before run ids wrote them
    assert [c.run_id for c in legacy.checkpoints()] == [None, None]
    assert CheckpointManager(root, monitor="eval_loss").resolve("best").name == "step-00000001"

    _save(CheckpointManager(root, keep_last=2, run_id="run-a"), 3)  # a run that resumed one of them

    assert _listing(root) == {"step-00000002", "step-00000003", "latest"}


def test_exporting_from_a_directory_that_does_not_exist_names_it_in_one_line(root: str) -> None:
    missing = f"{root}/nope_dir"

    with pytest.raises(CheckpointError) as raised, exported_file(missing, "best", "model.bin"):
        pass

    assert str(raised.value) == f"{missing}: no such directory"


# --- construction and imports ----------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "argument"), [
    ({"keep_last": 0}, "keep_last"),
    ({"keep_best": -1}, "keep_best"),
    ({"keep_best": 1}, "monitor"),
    ({"mode": "lowest"}, "mode"),
])
def test_invalid_constructor_arguments_raise_value_error_naming_the_argument(
        tmp_path: Any, kwargs: dict[str, Any], argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        CheckpointManager(str(tmp_path), **kwargs)


def test_importing_the_checkpoint_module_loads_no_framework_and_not_fsspec() -> None:
    probe = ("import json, sys\nimport hvdazure.core.checkpoint.store\n"
             "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
             "{'torch', 'tensorflow', 'keras', 'horovod', 'azure', 'fsspec'})))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)

    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


# --- crash safety of a re-save ---------------------------------------------------------------------------
class SimulatedCrash(BaseException):
    """The process dies here: no `except Exception` handler of the manager may catch it."""


class _CrashingFs:
    """The manager's filesystem, which dies at its `crash_at`-th call: that call and every later one raise
    SimulatedCrash, as if the process had been killed there (nothing after it runs, cleanup included)."""

    def __init__(self, fs: Any, crash_at: int | None = None) -> None:
        self._fs, self._crash_at, self.calls = fs, crash_at, 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._fs, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self._crash_at is not None and self.calls >= self._crash_at:
                raise SimulatedCrash(f"killed at {name}{args}")
            return attribute(*args, **kwargs)

        return call


def _resave_step_5(root: str, crash_at: int | None) -> int:
    """Save steps 4 and 5, then save step 5 again with new weights, dying at the `crash_at`-th storage call
    of that re-save (None: no crash). Returns the number of storage calls the re-save made."""
    manager = CheckpointManager(root)
    _save(manager, 4)
    _save(manager, 5)
    manager._fs = _CrashingFs(manager._fs, crash_at)
    with pytest.raises(SimulatedCrash) if crash_at is not None else contextlib.nullcontext():
        manager.save(5, {"model.bin": lambda f: f.write(b"new weights")}, {"reason": "again"})
    return manager._fs.calls


def test_a_crash_at_any_point_of_a_resave_leaves_a_valid_checkpoint_of_that_step(root: str) -> None:
    calls = _resave_step_5(f"{root}/complete", None)
    assert calls > 3

    for crash_at in range(1, calls + 1):
        where = f"{root}/crash-{crash_at}"
        _resave_step_5(where, crash_at)
        after = CheckpointManager(where)  # the next run: it cleans up, then looks for a checkpoint
        after.cleanup_temporaries()
        checkpoint, _ = after.latest_valid()

        assert checkpoint is not None and checkpoint.step == 5, f"crash at storage call {crash_at}"
        assert after.read_files(checkpoint)["model.bin"] in (_weights(5), b"new weights")


# --- retention counts verified checkpoints only ----------------------------------------------------------
# Each leaves step-00000003 as an interrupted object-store copy or damaged file would: its manifest is there.
HALF_COPIED: dict[str, Callable[[str], None]] = {
    "missing file": lambda d: _rm(f"{d}/model.bin"),
    "truncated file": lambda d: _pipe(f"{d}/model.bin", _cat(f"{d}/model.bin")[:1000]),
    "flipped bit": lambda d: _flip_a_bit(f"{d}/model.bin"),  # same size: only its hash tells
}


@pytest.mark.parametrize("damage", HALF_COPIED)
def test_an_invalid_checkpoint_does_not_push_a_valid_one_out_of_keep_last(root: str, damage: str) -> None:
    manager = CheckpointManager(root, keep_last=2)
    _save(manager, 1)
    _save(manager, 2)
    _save(CheckpointManager(root, keep_last=10), 3)  # written by another process: unknown to `manager`
    HALF_COPIED[damage](f"{root}/step-00000003")

    _save(manager, 4)

    assert _listing(root) == {"step-00000002", "step-00000004", "latest"}


def test_an_invalid_checkpoint_is_not_kept_as_the_best(root: str) -> None:
    manager = CheckpointManager(root, keep_last=1, keep_best=1, monitor="eval_loss")
    _save(manager, 1, eval_loss=0.5)
    _save(CheckpointManager(root, keep_last=10), 2, eval_loss=0.1)
    _rm(f"{root}/step-00000002/model.bin")

    _save(manager, 3, eval_loss=0.9)

    assert _listing(root) == {"step-00000001", "step-00000003", "latest"}


def test_retention_rereads_no_data_file_of_a_checkpoint_this_manager_wrote(root: str) -> None:
    manager = CheckpointManager(root, keep_last=3)
    _save(manager, 1)
    _save(manager, 2)
    opened: list[str] = []
    real_open = manager._fs.open

    class Spy(_CrashingFs):
        def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
            opened.append(f"{posixpath.basename(path)} {mode}")
            return real_open(path, mode, **kwargs)

    manager._fs = Spy(manager._fs)
    _save(manager, 3)

    assert [o for o in opened if o.endswith(" rb")] == []


# --- verified local files (what a resume loads from) -----------------------------------------------------
def test_local_files_gives_verified_paths_with_the_written_bytes(root: str) -> None:
    manager = CheckpointManager(root)
    checkpoint = _save(manager, 3)

    with manager.local_files(checkpoint) as paths:
        assert set(paths) == {"model.bin", "state.json"}
        with open(paths["model.bin"], "rb") as f:
            assert f.read() == _weights(3)
        copies = [p for p in paths.values() if not p.startswith(str(root))]
    assert not any(os.path.exists(p) for p in copies)  # temporary copies (object stores) are removed


@pytest.mark.parametrize("corruption", ["truncated file", "flipped bit", "missing file"])
def test_local_files_rejects_a_damaged_file_naming_it(root: str, corruption: str) -> None:
    manager = CheckpointManager(root)
    checkpoint = _save(manager, 3)
    CORRUPTIONS[corruption][0](f"{root}/step-00000003")

    damaged = r"step-00000003.*'model\.bin'"
    with pytest.raises(CheckpointError, match=damaged), manager.local_files(checkpoint):
        pass


def test_a_storage_error_while_reading_is_not_mistaken_for_an_invalid_checkpoint(tmp_path: Any) -> None:
    manager = CheckpointManager(str(tmp_path))
    checkpoint = _save(manager, 3)
    model = tmp_path / "step-00000003" / "model.bin"
    model.unlink()
    model.mkdir()  # reading it fails with an OSError, as a permission or network failure would

    with pytest.raises(IsADirectoryError), manager.local_files(checkpoint):
        pass
    with pytest.raises(IsADirectoryError), manager.open_latest_valid():
        pass


def test_open_latest_valid_falls_back_past_an_invalid_checkpoint(root: str) -> None:
    manager = CheckpointManager(root)
    _save(manager, 1)
    _save(manager, 2)
    _flip_a_bit(f"{root}/step-00000002/model.bin")

    with manager.open_latest_valid() as (checkpoint, paths, warnings):
        assert checkpoint.name == "step-00000001"
        with open(paths["model.bin"], "rb") as f:
            assert f.read() == _weights(1)
        assert len(warnings) == 1 and "step-00000002" in warnings[0]


def test_the_latest_pointer_file_is_recognised_as_its_directory(root: str) -> None:
    manager = CheckpointManager(root)
    _save(manager, 1)

    assert pointer_directory(f"{root}/latest") == root
    assert pointer_directory(f"{root}/step-00000001") is None
    assert pointer_directory(f"{root}/nothing-here") is None
