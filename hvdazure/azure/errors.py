"""Errors of a submission, the one rule for every message hvdazure prints about one (no secrets), and the
count check every option of a job goes through.

Azure SDK exceptions can carry SAS URLs (`...?sv=...&sig=...`), bearer tokens or storage keys in their text
(a failed blob upload names the URL it used). Everything shown to the user passes through `redact` first.
"""

from __future__ import annotations

import re


class SubmitError(Exception):
    """A submission cannot go ahead; the message is one line that says what to change."""


class JobSpecError(SubmitError, ValueError):
    """The job as asked is invalid (found offline, before anything is uploaded)."""


_SECRETS = [
    # SAS query parameters: the signature is the secret; the rest would only help to reuse it
    (re.compile(r"([?&](?:sig|se|sp|sv|sr|st|skoid|sktid|skt|ske|sks|skv|spr|srt|ss)=)[^&\s'\"]*", re.I),
     r"\1REDACTED"),
    (re.compile(r"(Bearer\s+)[A-Za-z0-9\-_.~+/=]+", re.I), r"\1REDACTED"),
    (re.compile(r"((?:AccountKey|SharedAccessSignature|SharedAccessKey|password|client_secret)\s*[=:]\s*)"
                r"[^;\s'\"&]+", re.I), r"\1REDACTED"),
    (re.compile(r"eyJ[A-Za-z0-9\-_]{8,}\.[A-Za-z0-9\-_]{8,}\.[A-Za-z0-9\-_]*"), "REDACTED-JWT"),
]


def redact(text: str) -> str:
    """`text` without SAS signatures, bearer tokens, JWTs, storage keys or passwords."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


def redacted_line(exc: BaseException) -> str:
    """An exception as one redacted line: its first non-empty line, prefixed with its type (not for our own
    SubmitError, whose message is already the line). The first line only, unlike core.errors.exception_line:
    the Azure SDKs' later lines are response dumps (headers, bodies) no one-line error should carry."""
    text = redact(str(exc)).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if isinstance(exc, SubmitError):
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def check_count(value: object, option: str, least: int = 1) -> int:
    """`value` as an integer of at least `least`, else one line naming `option` (bools are not counts)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobSpecError(f"{option} must be an integer, got {value!r}")
    if value < least:
        raise JobSpecError(f"{option} must be at least {least}, got {value}")
    return value
