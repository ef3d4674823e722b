"""Remote storage as the checkpoint manager uses it: which errors are worth retrying, the bounded
retry itself, one-line error messages, and keeping credentials out of everything written or printed.

Two layers retry, each for what it sees. The Azure SDK under adlfs retries every HTTP request on its own
(azure-storage-blob's ExponentialRetry: 3 retries after 15, 18 and 24 s, +-3 s, on 408, 5xx but 501 and
505, connection errors, timeouts; a download also re-requests a body cut short). On top of that, each
storage operation of a save or a load (write one file, read and verify one file, list, delete, the
`latest` pointer) is retried here, after RETRY_DELAYS, when it fails with a transient error: what the SDK
gave up on, and what it does not retry at all (HTTP 429, a body truncated three times over). Writing a file
again means calling its callback again: the bytes are hashed as they are written, so the manifest records
whatever the attempt that succeeded wrote. A permanent error (authentication, a missing container, a
transient one that outlasted the retries) becomes a StorageError: one line naming the operation, the URL
and the HTTP status and code, with any secret redacted.

Framework-free and SDK-free: errors are recognised by their HTTP status and by the names of the exception
types the SDK and aiohttp raise, so nothing here imports azure (adlfs is reached through fsspec).
"""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from hvdazure.core.rank_logging import logger

T = TypeVar("T")

# Seconds before the 2nd, 3rd and 4th attempt of one operation (each +-25%): bounded, about 13 s in all,
# on top of the SDK's own retries of each request.
RETRY_DELAYS: tuple[float, ...] = (1.0, 3.0, 9.0)
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# Connection failures, timeouts and bodies cut short, as azure-core and aiohttp name them.
_TRANSIENT_TYPES = frozenset({"ServiceRequestError", "ServiceResponseError", "ServiceRequestTimeoutError",
                              "ServiceResponseTimeoutError", "IncompleteReadError", "ClientPayloadError",
                              "ClientConnectionError", "ClientOSError", "ServerDisconnectedError",
                              "ServerTimeoutError", "ContentLengthError"})
# Environment variables whose values are credentials (adlfs and azure-identity read them).
SECRET_VARIABLES = ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CLIENT_SECRET",
                    "AZURE_CLIENT_SECRET", "AZURE_STORAGE_CONNECTION_STRING")
_SECRET_PATTERNS = [
    (re.compile(r"(?i)\b(AccountKey|SharedAccessSignature)=[^;\s'\"]+"), r"\1=<redacted>"),
    (re.compile(r"(?i)([?&]sig=)[^&\s'\"]+"), r"\1<redacted>"),
]
REDACTED = "<redacted>"


def filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem of a URL or local path and the path on it (abfs://c/d -> (AzureBlobFileSystem,
    "c/d")): the one way checkpoints and datasets open storage, so both find credentials alike (adlfs:
    AZURE_STORAGE_CONNECTION_STRING, or an account name with DefaultAzureCredential)."""
    import fsspec  # here, not at the top: `import hvdazure` stays fast

    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return fs, str(path)


def is_local(fs: Any) -> bool:
    """Whether an fsspec filesystem is this machine's own (FUSE mounts included)."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return bool({"file", "local"} & set(protocols))


class StorageError(OSError):
    """A storage operation failed for good; the one-line message names it, the URL and the cause."""


def retrying(what: str, call: Callable[[], T], passes: tuple[type[BaseException], ...] = (),
             sleep: Callable[[float], None] = time.sleep) -> T:
    """call(), again after each of RETRY_DELAYS while it fails with a transient error. Exceptions of the
    `passes` types (and FileNotFoundError, unless the container is missing) are raised as they are; any
    other failure as a StorageError whose message starts with `what` ("writing abfs://c/run1/x")."""
    delays = RETRY_DELAYS
    for attempt in range(len(delays) + 1):
        try:
            return call()
        except passes:
            raise
        except FileNotFoundError as exc:
            if _error_code(exc) != "ContainerNotFound":
                raise
            raise StorageError(f"{redact(what)} failed: {describe(exc)}") from None
        except Exception as exc:
            if attempt == len(delays) or not is_transient(exc):
                tries = f" (after {attempt + 1} attempts)" if attempt else ""
                raise StorageError(f"{redact(what)} failed{tries}: {describe(exc)}") from None
            delay = delays[attempt] * random.uniform(0.75, 1.25)
            logger.warning(f"{redact(what)}: {describe(exc)}; retrying in {delay:.1f} s "
                           f"(attempt {attempt + 2} of {len(delays) + 1})")
            sleep(delay)
    raise AssertionError("unreachable")


def is_transient(exc: BaseException) -> bool:
    """Whether trying the same operation again may succeed: a throttling or server-side status, a
    connection failure, a timeout or a truncated body, anywhere in the exception's chain."""
    for error in _chain(exc):
        if _status(error) in TRANSIENT_STATUSES or type(error).__name__ in _TRANSIENT_TYPES:
            return True
        if isinstance(error, ConnectionError | TimeoutError):
            return True
    return False


def describe(exc: BaseException) -> str:
    """One line for a storage failure: what kind, the HTTP status and storage error code where there are
    any, and the first line of the message; secrets redacted."""
    status = next((s for error in _chain(exc) if (s := _status(error)) is not None), None)
    code = _error_code(exc)
    if status in (401, 403):
        kind = "authentication failed (check the credentials: AZURE_STORAGE_CONNECTION_STRING, an " \
               "account key or SAS token, or the identity DefaultAzureCredential finds)"
    elif code == "ContainerNotFound":
        kind = "the container does not exist"
    else:
        kind = type(exc).__name__
    details = ", ".join(part for part in (f"HTTP {status}" if status else "", code or "") if part)
    message = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    text = kind + (f" ({details})" if details else "") + (f": {message}" if kind == type(exc).__name__
                                                          and message else "")
    return redact(text)


def redact(text: str) -> str:
    """`text` without the credentials it may hold: the values of SECRET_VARIABLES in the environment,
    an AccountKey= or SharedAccessSignature= in a connection string, a SAS signature in a URL."""
    for name in SECRET_VARIABLES:
        value = os.environ.get(name, "")
        for secret in _secret_parts(name, value):
            text = text.replace(secret, REDACTED)
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def _secret_parts(name: str, value: str) -> Iterator[str]:
    """The secrets in an environment variable's value: all of it, or a connection string's key and SAS
    (its endpoints and account name are not secret, and replacing them would blank out URLs)."""
    if not value:
        return
    if name != "AZURE_STORAGE_CONNECTION_STRING":
        yield value
        yield value.lstrip("?")
        return
    for part in value.split(";"):
        key, _, secret = part.partition("=")
        if key.strip().lower() in ("accountkey", "sharedaccesssignature") and secret:
            yield secret


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _status(error: BaseException) -> int | None:
    status = getattr(error, "status_code", None)
    return status if isinstance(status, int) else None


def _error_code(exc: BaseException) -> str | None:
    for error in _chain(exc):
        code = getattr(error, "error_code", None)
        if code:
            return str(getattr(code, "value", code))
    return None
