"""CheckpointManager on a flat-namespace Azure Blob container (Azurite), reached as abfs:// through adlfs,
as users have it: atomic saves with the manifest as the commit record, verification before use, `latest`,
fallback, retention, crashes and network faults (through the fault proxy), credentials kept out of sight.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

from hvdazure.core import object_store
from hvdazure.core.checkpoint.store import CheckpointError, CheckpointManager, StorageError, pointer_directory
from storage.azurite import ACCOUNT, ACCOUNT_KEY, Azurite, use_connection_string
from storage.conftest import ProxiedBlob
from storage.fault_proxy import Request

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _short_retry_delays(monkeypatch: pytest.MonkeyPatch) -> None:
    """hvdazure's own retries wait a few hundredths of a second here instead of seconds."""
    monkeypatch.setattr(object_store, "RETRY_DELAYS", (0.02, 0.05, 0.1))


def _weights(step: int) -> bytes:
    return bytes(range(256)) * 64 + f"step {step}".encode()


def _save(manager: CheckpointManager, step: int, weights: bytes | None = None, **metrics: float) -> Any:
    data = _weights(step) if weights is None else weights
    files = {"model.bin": lambda f: f.write(data), "state.json": lambda f: f.write(b'{"step": %d}' % step)}
    return manager.save(step, files, {"metrics": metrics, "framework": "test"})


def _objects(url: str) -> set[str]:
    """Every blob under `url`, relative to it: a flat namespace has nothing else."""
    fs, root = fsspec.core.url_to_fs(url)
    return {path[len(root) + 1:] for path in fs.find(root)}


def _cat(url: str) -> bytes:
    fs, path = fsspec.core.url_to_fs(url)
    return fs.cat_file(path)


def _pipe(url: str, data: bytes) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    fs.pipe_file(path, data)


def _rm(url: str) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    fs.rm(path)


def _flip_a_bit(url: str) -> None:
    data = bytearray(_cat(url))
    data[100] ^= 1
    _pipe(url, bytes(data))


# --- the issue: a save on a flat namespace --------------------------------------------------------------
def test_a_checkpoint_saved_to_a_container_path_loads_back_verified(blob_url: str) -> None:
    # The README's example: before the object-store protocol, every save failed with "No such file or
    # directory: 'ckpt/run1/.tmp-step-...'", since a flat namespace has no directory to rename.
    run = f"{blob_url}/run1"
    manager = CheckpointManager(run)
    checkpoint = _save(manager, 23)

    assert checkpoint.url == f"{run}/step-00000023"
    assert _objects(run) == {"step-00000023/model.bin", "step-00000023/state.json",
                             "step-00000023/manifest.json", "latest"}
    assert _cat(f"{run}/latest") == b"step-00000023\n"
    fresh = CheckpointManager(run)  # another process: nothing remembered
    found, warnings = fresh.latest_valid()
    assert found is not None and found.name == "step-00000023" and warnings == []
    assert fresh.read_files(found) == {"model.bin": _weights(23), "state.json": b'{"step": 23}'}
    with fresh.open_latest_valid() as (opened, paths, _):
        assert opened == found and Path(paths["model.bin"]).read_bytes() == _weights(23)
    assert pointer_directory(f"{run}/latest") == run


def test_the_manifest_is_uploaded_after_every_file_and_latest_after_the_manifest(
        proxied_blob: ProxiedBlob) -> None:
    manager = CheckpointManager(f"{proxied_blob.url}/run1")
    proxied_blob.proxy.requests.clear()
    _save(manager, 1)

    # A blob appears when its upload is committed: one PUT, or the PUT of its block list after its blocks.
    commits = [r.target.split("?")[0].split("/run1/", 1)[1] for r in proxied_blob.proxy.requests
               if r.method == "PUT" and "comp=block&" not in r.target]
    assert commits[-2:] == ["step-00000001/manifest.json", "latest"]
    assert sorted(commits[:-2]) == ["step-00000001/model.bin", "step-00000001/state.json"]
    assert not [r for r in proxied_blob.proxy.requests if ".tmp-" in r.target]  # no rename, no temporary


def test_the_local_filesystem_keeps_its_temporary_directory_and_rename(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    moved: list[tuple[str, str]] = []
    manager = CheckpointManager(str(tmp_path / "run1"))
    real_mv = manager._fs.mv
    monkeypatch.setattr(manager._fs, "mv", lambda a, b, **kw: moved.append((Path(a).name, Path(b).name))
                        or real_mv(a, b, **kw))
    _save(manager, 1)

    assert [dst for _, dst in moved] == ["step-00000001", "latest"]
    assert all(src.startswith(".tmp-") for src, _ in moved)


# --- verification, latest, fallback, retention -----------------------------------------------------------
CORRUPTIONS: dict[str, Callable[[str], None]] = {
    "flipped bit": lambda d: _flip_a_bit(f"{d}/model.bin"),
    "truncated file": lambda d: _pipe(f"{d}/model.bin", _cat(f"{d}/model.bin")[:1000]),
    "missing file": lambda d: _rm(f"{d}/model.bin"),
    "missing manifest": lambda d: _rm(f"{d}/manifest.json"),
    "garbage manifest": lambda d: _pipe(f"{d}/manifest.json", b'{"step": 2, "fil'),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_with_a_warning(blob_url: str,
                                                                               corruption: str) -> None:
    run = f"{blob_url}/run1"
    _save(CheckpointManager(run), 1)
    _save(CheckpointManager(run), 2)
    CORRUPTIONS[corruption](f"{run}/step-00000002")
    manager = CheckpointManager(run)

    checkpoint, warnings = manager.latest_valid()
    assert checkpoint is not None and checkpoint.name == "step-00000001"
    assert len(warnings) == 1 and "step-00000002" in warnings[0]
    with manager.open_latest_valid() as (opened, paths, _):
        assert opened.name == "step-00000001" and Path(paths["model.bin"]).read_bytes() == _weights(1)
    with pytest.raises(CheckpointError, match="step-00000002"):
        manager.open(f"{run}/step-00000002")


def test_retention_keeps_the_newest_verified_checkpoints_and_deletes_every_object_of_the_rest(
        blob_url: str) -> None:
    run = f"{blob_url}/run1"
    manager = CheckpointManager(run, keep_last=2)
    for step in range(1, 4):
        _save(manager, step)
    _save(CheckpointManager(run, keep_last=10), 4)  # another process's, then damaged: it must not count
    _flip_a_bit(f"{run}/step-00000004/model.bin")

    _save(manager, 5)

    assert {name.split("/")[0] for name in _objects(run)} == {"step-00000003", "step-00000005", "latest"}


def test_leftovers_of_a_killed_writer_never_pass_for_a_checkpoint_and_are_deleted(blob_url: str) -> None:
    run = f"{blob_url}/run1"
    _save(CheckpointManager(run), 1)
    _pipe(f"{run}/step-00000002/model.bin", _weights(2))  # killed before its manifest was uploaded
    manager = CheckpointManager(run)

    assert [c.name for c in manager.checkpoints()] == ["step-00000001"]
    assert manager.latest_valid()[0].name == "step-00000001"
    resaved = _save(manager, 2, weights=b"again")
    assert resaved.name == "step-00000002-v2"  # a name with objects left under it is not reused
    assert {name.split("/")[0] for name in _objects(run)} == {"step-00000001", "step-00000002-v2", "latest"}


def test_a_resave_of_the_step_latest_names_replaces_it_with_a_new_version(blob_url: str) -> None:
    run = f"{blob_url}/run1"
    manager = CheckpointManager(run)
    _save(manager, 5)
    checkpoint = _save(manager, 5, weights=b"new weights")

    assert checkpoint.name == "step-00000005-v2"
    assert _cat(f"{run}/latest") == b"step-00000005-v2\n"
    assert {name.split("/")[0] for name in _objects(run)} == {"step-00000005-v2", "latest"}


# --- a writer killed between any two storage requests of a save ------------------------------------------
# The writers are processes forked by one that imported hvdazure, adlfs and the Azure SDK once (a second
# each, and the kill test starts one writer per request of a save); what a writer does and how it is
# killed is as if it had been started on its own.
_WRITERS = textwrap.dedent("""
    import os
    import sys
    import traceback

    import adlfs  # noqa: F401  (abfs://, imported before the forks)
    from hvdazure.core.checkpoint.store import CheckpointManager

    def save(url):
        manager = CheckpointManager(url)
        manager.save(5, {"model.bin": lambda f: f.write(b"new weights" * 1000),
                         "state.json": lambda f: f.write(b'{"step": 5}')}, {"reason": "again"})
        print("saved")

    for line in sys.stdin:
        url, log = line.rstrip("\\n").split("\\t")
        pid = os.fork()
        if pid == 0:
            with open(log, "w") as out:
                os.dup2(out.fileno(), 1)
                os.dup2(out.fileno(), 2)
            try:
                save(url)
                code = 0
            except BaseException:
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            os._exit(code)
        print(pid, flush=True)
        print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
""")


class Writers:
    """Re-saves step 5 of a run in a child process through the proxy, as a second job would; the children
    are forked by one process started here (with this test's environment: the proxy's port)."""

    def __init__(self, logs: Path) -> None:
        self._logs, self._count = logs, 0
        self._server = subprocess.Popen([sys.executable, "-c", _WRITERS], text=True, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})

    def close(self) -> None:
        assert self._server.stdin is not None
        self._server.stdin.close()
        try:
            self._server.wait(timeout=30)
        finally:
            self._server.kill()

    def run(self, url: str, proxy: Any, kill_at: int | None) -> subprocess.CompletedProcess[str]:
        """Re-save step 5 at `url`; SIGKILL the writer when its `kill_at`-th request arrives, before that
        request reaches storage. A hang fails on the suite's per-test timeout."""
        assert self._server.stdin is not None and self._server.stdout is not None
        self._count += 1
        log = self._logs / f"writer-{self._count}.log"
        started, ended = threading.Event(), threading.Event()
        pid = 0

        def kill(request: Request) -> bool:
            started.wait(60)
            os.kill(pid, signal.SIGKILL)
            ended.wait(60)  # reaped: dead before its request is dropped
            return False

        proxy.clear()
        if kill_at is not None:
            proxy.inject("call", nth=kill_at, callback=kill)
        self._server.stdin.write(f"{url}\t{log}\n")
        self._server.stdin.flush()
        pid = int(self._server.stdout.readline())
        started.set()
        returncode = int(self._server.stdout.readline())
        ended.set()
        proxy.clear()
        output = log.read_text()
        return subprocess.CompletedProcess([url], returncode, output, output)


@pytest.fixture
def writers(tmp_path: Path, proxied_blob: ProxiedBlob) -> Iterator[Writers]:
    """Writers for this test, which see the storage through its proxy."""
    server = Writers(tmp_path)
    yield server
    server.close()


def test_a_writer_killed_between_any_two_requests_of_a_save_never_leaves_a_wrong_checkpoint(
        proxied_blob: ProxiedBlob, writers: Writers) -> None:
    old = {"model.bin": _weights(5), "state.json": b'{"step": 5}'}
    new = {"model.bin": b"new weights" * 1000, "state.json": b'{"step": 5}'}
    proxy = proxied_blob.proxy

    def prepare(run: str) -> None:
        _save(CheckpointManager(run), 5)

    prepare(f"{proxied_blob.url}/complete")
    before = len(proxy.requests)
    done = writers.run(f"{proxied_blob.url}/complete", proxy, None)
    assert done.returncode == 0, done.stderr
    requests = len(proxy.requests) - before
    assert requests >= 8  # listing, 2 files and the manifest (2 requests each), latest, retention

    for kill_at in range(1, requests + 1):
        run = f"{proxied_blob.url}/kill-{kill_at}"
        prepare(run)
        killed = writers.run(run, proxy, kill_at)
        assert killed.returncode == -signal.SIGKILL, f"request {kill_at}: {killed.stderr}"

        after = CheckpointManager(run)  # the next run: cleans up, then looks for a checkpoint
        after.cleanup_temporaries()
        checkpoint, _ = after.latest_valid()
        assert checkpoint is not None and checkpoint.step == 5, f"killed at request {kill_at}"
        assert after.read_files(checkpoint) in (old, new), f"killed at request {kill_at}"
        for candidate in after.checkpoints():  # whatever verifies holds exactly what some save wrote
            try:
                after.verify(candidate)
            except CheckpointError:
                continue
            assert after.read_files(candidate) in (old, new), f"killed at request {kill_at}"


def test_a_checkpoint_another_process_wrote_is_seen_by_a_manager_that_listed_before(
        proxied_blob: ProxiedBlob, writers: Writers) -> None:
    run = f"{proxied_blob.url}/run1"
    manager = CheckpointManager(run)
    _save(manager, 5)
    assert manager.latest_valid()[0].name == "step-00000005"  # fsspec now holds listings of run1

    assert writers.run(run, proxied_blob.proxy, None).returncode == 0  # saves step-00000005-v2

    checkpoint, warnings = manager.latest_valid()
    assert checkpoint is not None and checkpoint.name == "step-00000005-v2" and warnings == []


# --- network faults during save and load -----------------------------------------------------------------
FAULTS_DURING_SAVE: dict[str, dict[str, Any]] = {
    "503 on a file's upload (the SDK retries)": {"kind": "status", "status": 503, "method": "PUT",
                                                 "path": "model.bin"},
    "429 on the manifest's upload (hvdazure retries)": {"kind": "status", "status": 429, "method": "PUT",
                                                        "path": "manifest.json"},
    "500 three times on the file's upload": {"kind": "status", "status": 500, "times": 5, "method": "PUT",
                                             "path": "model.bin"},
    "connection dropped on the upload of latest": {"kind": "drop", "method": "PUT", "path": "/latest"},
    "manifest stored, the response lost": {"kind": "drop_after", "method": "PUT", "path": "manifest.json"},
    "listing answered 503": {"kind": "status", "status": 503, "method": "GET", "path": "comp=list"},
}


@pytest.mark.parametrize("fault", FAULTS_DURING_SAVE)
def test_a_save_through_transient_faults_succeeds_and_verifies(proxied_blob: ProxiedBlob, fault: str) -> None:
    run = f"{proxied_blob.url}/run1"
    _save(CheckpointManager(run), 1)
    injected = proxied_blob.proxy.inject(**FAULTS_DURING_SAVE[fault])

    _save(CheckpointManager(run), 2)

    assert injected.applied >= 1
    proxied_blob.proxy.clear()
    checkpoint, warnings = CheckpointManager(run).latest_valid()
    assert checkpoint is not None and checkpoint.name == "step-00000002" and warnings == []
    assert CheckpointManager(run).read_files(checkpoint)["model.bin"] == _weights(2)


FAULTS_DURING_LOAD: dict[str, dict[str, Any]] = {
    "truncated body of the model": {"kind": "truncate", "keep_bytes": 100, "method": "GET",
                                    "path": "model.bin"},
    "truncated body four times": {"kind": "truncate", "keep_bytes": 100, "times": 4, "method": "GET",
                                  "path": "model.bin"},
    "429 on the manifest": {"kind": "status", "status": 429, "method": "GET", "path": "manifest.json"},
    "503 on latest": {"kind": "status", "status": 503, "method": "GET", "path": "/latest"},
    "connection dropped reading the model": {"kind": "drop", "method": "GET", "path": "model.bin"},
}


@pytest.mark.parametrize("fault", FAULTS_DURING_LOAD)
def test_a_resume_through_transient_faults_loads_the_newest_checkpoint_without_falling_back(
        proxied_blob: ProxiedBlob, fault: str) -> None:
    run = f"{proxied_blob.url}/run1"
    _save(CheckpointManager(run), 1)
    _save(CheckpointManager(run), 2)
    injected = proxied_blob.proxy.inject(**FAULTS_DURING_LOAD[fault])

    with CheckpointManager(run).open_latest_valid() as (checkpoint, paths, warnings):
        assert checkpoint is not None and checkpoint.name == "step-00000002" and warnings == []
        assert Path(paths["model.bin"]).read_bytes() == _weights(2)
    assert injected.applied >= 1


def test_a_slow_narrow_link_still_saves_and_loads_verified(proxied_blob: ProxiedBlob) -> None:
    proxied_blob.proxy.latency, proxied_blob.proxy.bandwidth = 0.02, 2_000_000
    run = f"{proxied_blob.url}/run1"
    big = os.urandom(1 << 20)
    checkpoint = CheckpointManager(run).save(1, {"model.bin": lambda f: f.write(big)}, {})

    assert CheckpointManager(run).read_files(checkpoint) == {"model.bin": big}


def test_a_save_that_keeps_failing_is_one_line_and_leaves_the_previous_checkpoint_latest(
        proxied_blob: ProxiedBlob) -> None:
    run = f"{proxied_blob.url}/run1"
    _save(CheckpointManager(run), 1)
    proxied_blob.proxy.inject("status", status=503, times=1000, method="PUT", path="manifest.json")

    with pytest.raises(StorageError) as error:
        _save(CheckpointManager(run), 2)

    message = str(error.value)
    assert message.startswith(f"writing {run}/step-00000002/manifest.json failed (after 4 attempts): ")
    assert "HTTP 503" in message and "\n" not in message
    proxied_blob.proxy.clear()
    assert CheckpointManager(run).latest_valid()[0].name == "step-00000001"
    assert "step-00000002/manifest.json" not in _objects(run)


# --- permanent errors, credentials -----------------------------------------------------------------------
def test_a_wrong_key_is_one_line_naming_the_url_without_the_key(azurite: Azurite, blob_url: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    wrong_key = "A" * 86 + "=="
    use_connection_string(monkeypatch, azurite.connection_string().replace(ACCOUNT_KEY, wrong_key))
    run = f"{blob_url}/run1"

    with pytest.raises(StorageError) as error:
        _save(CheckpointManager(run), 1)

    message = str(error.value)
    assert message.startswith(f"listing {run} failed: authentication failed")
    assert "HTTP 403" in message and "\n" not in message and wrong_key not in message


def test_a_missing_container_is_one_line_on_save_and_on_resume(azurite: Azurite, blob_url: str) -> None:
    run = "abfs://no-such-container/run1"

    with pytest.raises(StorageError, match=r"^listing abfs://no-such-container/run1 failed: the container "
                                           r"does not exist \(HTTP 404, ContainerNotFound\)$"):
        _save(CheckpointManager(run), 1)
    with pytest.raises(StorageError, match="the container does not exist"):
        CheckpointManager(run).latest_valid()


def test_no_credential_is_printed_logged_or_written_into_a_checkpoint(
        proxied_blob: ProxiedBlob, caplog: pytest.LogCaptureFixture,
        capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)  # the SDK's own request logs included
    connection = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
    run = f"{proxied_blob.url}/run1"
    manager = CheckpointManager(run)
    # A manifest field that happens to hold the connection string (a config echoing the environment).
    manager.save(1, {"model.bin": lambda f: f.write(_weights(1))}, {"config": {"storage": connection}})
    proxied_blob.proxy.inject("status", status=503, times=1000, method="PUT", path="latest")
    with pytest.raises(StorageError) as error:
        _save(manager, 2)
    proxied_blob.proxy.clear()
    proxied_blob.proxy.inject("truncate", keep_bytes=10, times=1000, method="GET", path="model.bin")
    with pytest.raises(StorageError) as read_error:
        CheckpointManager(run).read_files(CheckpointManager(run).open(f"{run}/step-00000001", verify=False))
    proxied_blob.proxy.clear()

    manifest = json.loads(_cat(f"{run}/step-00000001/manifest.json"))
    assert manifest["config"]["storage"].count("<redacted>") == 1
    stored = b"".join(_cat(f"{run}/{name}") for name in _objects(run))
    out, err = capfd.readouterr()
    seen = "\n".join([out, err, caplog.text, str(error.value), str(read_error.value)])
    assert ACCOUNT_KEY not in seen and ACCOUNT_KEY.encode() not in stored
    assert "AccountKey=Eby8" not in seen


def test_a_sas_token_in_the_connection_string_is_enough_and_stays_out_of_the_manifest(
        azurite: Azurite, blob_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import datetime, timedelta, timezone

    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    sas = generate_account_sas(ACCOUNT, ACCOUNT_KEY, ResourceTypes(container=True, object=True),
                               AccountSasPermissions(read=True, write=True, delete=True, list=True),
                               expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    use_connection_string(monkeypatch, f"BlobEndpoint={azurite.endpoint()};SharedAccessSignature={sas}")
    run = f"{blob_url}/run1"
    checkpoint = CheckpointManager(run).save(1, {"model.bin": lambda f: f.write(b"w" * 100)},
                                             {"config": {"where": f"{azurite.endpoint()}?{sas}"}})

    assert CheckpointManager(run).read_files(checkpoint) == {"model.bin": b"w" * 100}
    stored = _cat(f"{run}/step-00000001/manifest.json").decode()
    assert "sig=" in sas and sas not in stored and f"{azurite.endpoint()}?<redacted>" in stored
