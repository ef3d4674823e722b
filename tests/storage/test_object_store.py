"""hvdazure.core.object_store: which failures are retried, how often, and the one line a failure becomes.

The exceptions here are stand-ins named and shaped like azure-core's and aiohttp's (status_code,
error_code, a cause chain); test_blob_checkpoints.py meets the real ones, from Azurite through a proxy."""

from __future__ import annotations

from typing import Any

import pytest

from hvdazure.core import object_store
from hvdazure.core.object_store import StorageError, describe, is_transient, redact, retrying


class HttpResponseError(Exception):
    def __init__(self, message: str, status_code: int | None = None, error_code: str | None = None) -> None:
        super().__init__(message)
        self.status_code, self.error_code = status_code, error_code


class ServiceRequestError(Exception):
    """azure-core's name for a request that never got an answer (connection refused, timed out)."""


class IncompleteReadError(Exception):
    """azure-core's name for a response body cut short."""


def _wrapped(inner: BaseException) -> RuntimeError:
    """What adlfs raises for a failed block upload: a RuntimeError whose cause is the SDK's error."""
    try:
        raise RuntimeError(f"Failed to upload block: {inner}!") from inner
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize("error", [
    HttpResponseError("busy", 503, "ServerBusy"), HttpResponseError("slow down", 429),
    HttpResponseError("internal", 500), HttpResponseError("timeout", 408),
    ServiceRequestError("Cannot connect to host"), IncompleteReadError("Response payload is not completed"),
    ConnectionResetError(104, "Connection reset by peer"), TimeoutError("read timed out"),
    _wrapped(HttpResponseError("busy", 503)),
], ids=lambda e: f"{type(e).__name__}-{getattr(e, 'status_code', '')}")
def test_throttling_server_errors_resets_timeouts_and_truncated_bodies_are_transient(
        error: Exception) -> None:
    assert is_transient(error)


@pytest.mark.parametrize("error", [
    HttpResponseError("Server failed to authenticate the request", 403, "AuthenticationFailed"),
    HttpResponseError("The specified container does not exist.", 404, "ContainerNotFound"),
    HttpResponseError("not implemented", 501), ValueError("bad"), PermissionError(13, "denied"),
], ids=lambda e: f"{type(e).__name__}-{getattr(e, 'status_code', '')}")
def test_authentication_missing_resources_and_programming_errors_are_permanent(error: Exception) -> None:
    assert not is_transient(error)


class _Flaky:
    """Fails with `errors` in turn, then returns "done"."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors, self.calls = list(errors), 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def test_a_transient_failure_is_retried_after_the_configured_delays_then_succeeds() -> None:
    slept: list[float] = []
    flaky = _Flaky(HttpResponseError("busy", 503), ConnectionResetError("reset"))

    assert retrying("writing abfs://c/run1/x", flaky, sleep=slept.append) == "done"
    assert flaky.calls == 3
    assert len(slept) == 2
    for delay, configured in zip(slept, object_store.RETRY_DELAYS, strict=False):
        assert 0.75 * configured <= delay <= 1.25 * configured


def test_retries_are_bounded_and_the_last_failure_is_one_line_naming_the_operation() -> None:
    slept: list[float] = []
    flaky = _Flaky(*[HttpResponseError("busy\nRequestId:1\nContent: <xml/>", 503, "ServerBusy")] * 10)

    with pytest.raises(StorageError) as error:
        retrying("writing abfs://c/run1/x", flaky, sleep=slept.append)

    attempts = len(object_store.RETRY_DELAYS) + 1
    assert flaky.calls == attempts and len(slept) == attempts - 1
    assert str(error.value) == (f"writing abfs://c/run1/x failed (after {attempts} attempts): "
                                "HttpResponseError (HTTP 503, ServerBusy): busy")


def test_a_permanent_failure_is_not_retried() -> None:
    flaky = _Flaky(HttpResponseError("Server failed to authenticate the request.\nRequestId:2", 403,
                                     "AuthenticationFailed"))

    with pytest.raises(StorageError, match=r"^listing abfs://c/run1 failed: authentication failed \(check "
                                           r".*\(HTTP 403, AuthenticationFailed\)$"):
        retrying("listing abfs://c/run1", flaky, sleep=pytest.fail)
    assert flaky.calls == 1


def test_a_missing_file_passes_unchanged_and_a_missing_container_is_a_storage_error() -> None:
    with pytest.raises(FileNotFoundError) as missing:
        retrying("reading x", _Flaky(FileNotFoundError(2, "No such file", "c/run1/x")), sleep=pytest.fail)
    assert type(missing.value) is FileNotFoundError

    try:
        raise FileNotFoundError(2, "No such file", "c/run1") from HttpResponseError(
            "The specified container does not exist.", 404, "ContainerNotFound")
    except FileNotFoundError as exc:
        no_container = exc
    with pytest.raises(StorageError, match=r"^listing abfs://c/run1 failed: the container does not exist "
                                           r"\(HTTP 404, ContainerNotFound\)$"):
        retrying("listing abfs://c/run1", _Flaky(no_container), sleep=pytest.fail)


def test_exceptions_of_the_passed_types_and_base_exceptions_are_raised_as_they_are() -> None:
    class Verdict(Exception):
        pass

    with pytest.raises(Verdict):
        retrying("reading x", _Flaky(Verdict("corrupt")), passes=(Verdict,), sleep=pytest.fail)
    with pytest.raises(KeyboardInterrupt):
        retrying("reading x", _Flaky(KeyboardInterrupt()), sleep=pytest.fail)


def test_each_retry_is_logged_as_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING")
    flaky = _Flaky(HttpResponseError("slow down", 429))
    retrying("reading abfs://c/run1/latest", flaky, sleep=lambda seconds: None)

    (record,) = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert record.getMessage().startswith("reading abfs://c/run1/latest: HttpResponseError (HTTP 429): slow "
                                          "down; retrying in ")
    assert record.getMessage().endswith("(attempt 2 of 4)")


SECRET_KEY = "c2VjcmV0LWtleS1vZi10aGUtYWNjb3VudA=="
SAS = "sv=2024-01-01&ss=b&srt=sco&sp=rwdl&se=2030-01-01&sig=abc%2Fdef%3D"


@pytest.mark.parametrize("variable", ["AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN",
                                      "AZURE_STORAGE_CLIENT_SECRET", "AZURE_CLIENT_SECRET"])
def test_redact_removes_the_credentials_in_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                          variable: str) -> None:
    monkeypatch.setenv(variable, SECRET_KEY)

    assert redact(f"failed with {SECRET_KEY} in it") == "failed with <redacted> in it"


def test_redact_removes_a_connection_strings_key_and_sas_but_keeps_its_endpoint(
        monkeypatch: pytest.MonkeyPatch) -> None:
    connection = (f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={SECRET_KEY};"
                  f"SharedAccessSignature={SAS};BlobEndpoint=https://acct.blob.core.windows.net/")
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", connection)

    text = redact(f"raw {SECRET_KEY} | {SAS} | https://acct.blob.core.windows.net/c")
    assert SECRET_KEY not in text and "sig=abc" not in text
    assert text == "raw <redacted> | <redacted> | https://acct.blob.core.windows.net/c"


def test_redact_removes_keys_and_signatures_it_was_not_told_about() -> None:
    text = redact(f"AccountKey={SECRET_KEY};x https://a.blob.core.windows.net/c/b?sv=1&sig=s3cr3t&se=2")

    assert text == "AccountKey=<redacted>;x https://a.blob.core.windows.net/c/b?sv=1&sig=<redacted>&se=2"


def test_describe_gives_one_line_without_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", SECRET_KEY)
    error: Any = HttpResponseError(f"bad key {SECRET_KEY}\nRequestId:3", 400, "InvalidHeaderValue")

    assert describe(error) == "HttpResponseError (HTTP 400, InvalidHeaderValue): bad key <redacted>"
