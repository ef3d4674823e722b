"""Azurite (Microsoft's Azure Storage emulator) for the tests: a real flat-namespace Blob endpoint on
127.0.0.1, which fsspec's memory:// is not (it has directories and renames).

`azurite` (session-scoped) starts `azurite-blob` on a free port with its own data directory and stops it
at the end; `blob_url` gives each test a fresh container as `abfs://<container>`, with the development
account's connection string in AZURE_STORAGE_CONNECTION_STRING, as a user's job has its own. The account
(devstoreaccount1) and its key are Azurite's public, well-known ones. Azurite comes from the cache
scripts/install_azurite.sh fills (scripts/setup_env.sh runs it); where the cache lacks it the fixture runs
that script, and only where Node.js or npm cannot be had are the tests skipped, saying why.

Import the fixtures into a test module (`from storage.azurite import azurite, blob_url`) or use them under
tests/storage/, whose conftest.py does.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key (public, documented by Microsoft; it protects nothing).
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
# The Azure SDK's retry backoff (15 s and more) is multiplied by this in the tests: about 15 ms; a test that
# lets every retry fail (a save that keeps failing) waits a dozen of these, not a dozen times 0.3 s.
SDK_BACKOFF_FACTOR = 0.001
_NOT_INSTALLABLE = 3  # install_azurite.sh's exit status where Node.js or npm is missing


@dataclass
class Azurite:
    """A running azurite-blob."""

    port: int
    location: Path
    process: subprocess.Popen[bytes]

    def endpoint(self, port: int | None = None) -> str:
        """The account's Blob endpoint, on Azurite's port or on `port` (a proxy in front of it)."""
        return f"http://127.0.0.1:{port or self.port}/{ACCOUNT}"

    def connection_string(self, port: int | None = None) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                f"BlobEndpoint={self.endpoint(port)};")

    def create_container(self) -> str:
        from azure.storage.blob import BlobServiceClient

        name = f"t-{uuid.uuid4().hex[:20]}"
        BlobServiceClient.from_connection_string(self.connection_string()).create_container(name)
        return name


def azurite_blob_command() -> str:
    """The path of azurite-blob, installed into the cache first if need be; pytest.skip without Node.js."""
    proc = subprocess.run(["bash", str(ROOT / "scripts/install_azurite.sh")], capture_output=True, text=True)
    if proc.returncode == _NOT_INSTALLABLE:
        pytest.skip(f"Azurite cannot be installed: {proc.stderr.strip()}")
    if proc.returncode != 0:
        raise RuntimeError(f"installing Azurite failed:\n{proc.stderr}")
    return proc.stdout.strip().splitlines()[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_azurite(location: Path) -> Iterator[Azurite]:
    """azurite-blob on 127.0.0.1 on a free port, storing into `location`; stopped on exit."""
    command = azurite_blob_command()
    for _ in range(5):  # the port may be taken between choosing and binding it
        port = free_port()
        log = location / "azurite.log"
        process = subprocess.Popen(
            [command, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(location),
             "--skipApiVersionCheck", "--silent", "--loose"],
            stdout=log.open("wb"), stderr=subprocess.STDOUT)
        if _wait_listening(port, process):
            break
        process.kill()
        process.wait()
    else:
        raise RuntimeError(f"Azurite did not start: {log.read_text()[-2000:]}")
    try:
        yield Azurite(port, location, process)
    finally:  # killed: its data directory is thrown away, and a graceful stop takes about 9 s
        process.kill()
        process.wait()


def _wait_listening(port: int, process: subprocess.Popen[bytes], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.1)
    return False


def use_connection_string(monkeypatch: pytest.MonkeyPatch, connection_string: str) -> None:
    """Point abfs:// at an endpoint as a user would (the environment), dropping cached filesystems that
    were made for another one (fsspec caches instances by their arguments, not the environment)."""
    for name in ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection_string)
    forget_filesystems()


def forget_filesystems() -> None:
    from adlfs import AzureBlobFileSystem

    AzureBlobFileSystem.clear_instance_cache()


def shorten_sdk_backoff(monkeypatch: pytest.MonkeyPatch, factor: float = SDK_BACKOFF_FACTOR) -> None:
    """The Azure SDK's retry policy waits 15 s and more before retrying a 5xx or a reset connection;
    in these tests it waits `factor` of that (the same policy, the same retries, shorter sleeps)."""
    from azure.storage.blob._shared import policies_async

    original = policies_async.ExponentialRetry.get_backoff_time

    def shorter(self: Any, settings: dict[str, Any]) -> float:
        return original(self, settings) * factor

    monkeypatch.setattr(policies_async.ExponentialRetry, "get_backoff_time", shorter)


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    with tempfile.TemporaryDirectory(prefix="hvdazure-azurite-") as location, \
            running_azurite(Path(location)) as service:
        yield service


@pytest.fixture
def blob_url(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh container on Azurite, as `abfs://<container>`; its connection string in the environment."""
    container = azurite.create_container()
    use_connection_string(monkeypatch, azurite.connection_string())
    shorten_sdk_backoff(monkeypatch)
    yield f"abfs://{container}"
    forget_filesystems()

