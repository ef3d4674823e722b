"""Errors of a submission, the one rule for what counts as a credential (kept out of every message
hvdazure prints, and out of every job it submits), and the count check every option of a job goes through.

Azure SDK exceptions can carry SAS URLs (`...?sv=...&sig=...`), bearer tokens or storage keys in their text
(a failed blob upload names the URL it used). Everything shown to the user passes through `redact` first.
A storage key is recognised in a connection string (`AccountKey=...`, `SharedAccessSignature=...`) and
alone (88 characters of base64: 64 bytes); the price of the second is that any other base64 of 64 bytes
(a SHA-512 digest in base64) is taken for one. The same patterns say whether a value of a job is a
credential (`credential_in`, applied to every field of a job by spec.job.check_credentials through
credential_check.py), and `named_like_credential` whether a name says it holds one.
"""

from __future__ import annotations

import re


class SubmitError(Exception):
    """A submission cannot go ahead; the message is one line that says what to change."""


class JobSpecError(SubmitError, ValueError):
    """The job as asked is invalid (found offline, before anything is uploaded)."""


class JobError(SubmitError):
    """An `hvdazure jobs` command cannot do what was asked (no such job, nothing to cancel); one line."""


# (what it is, named in a refusal instead of the value; the pattern; what replaces the secret part)
_CREDENTIALS = [
    ("a SAS signature, sig=", re.compile(r"([?&]sig=)[^&\s'\"]*", re.I), r"\1REDACTED"),
    ("a bearer token", re.compile(r"(Bearer\s+)[A-Za-z0-9\-_.~+/=]+", re.I), r"\1REDACTED"),
    ("a key or password", re.compile(r"((?:AccountKey|SharedAccessSignature|SharedAccessKey|password|"
                                     r"client_secret)\s*[=:]\s*)[^;\s'\"&]+", re.I), r"\1REDACTED"),
    ("a JWT", re.compile(r"eyJ[A-Za-z0-9\-_]{8,}\.[A-Za-z0-9\-_]*(?:\.[A-Za-z0-9\-_]*)?"), "REDACTED-JWT"),
    # a storage account key alone: 64 random bytes in base64, 88 characters ending in '==' (the character
    # before them is one of AQgw, the only ones whose unused low bits are zero), between non-base64 characters
    ("a storage account key", re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{85}[AQgw]==(?![A-Za-z0-9+/=])"),
     "REDACTED-KEY"),
]
# A SAS URL's other query parameters are no credential alone, but would help to reuse its signature: they
# are removed from messages, and not refused in a job.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours azure-ai-ml writes into its exceptions' text
_SAS_PARAMETERS = re.compile(r"([?&](?:se|sp|sv|sr|st|skoid|sktid|skt|ske|sks|skv|spr|srt|ss)=)[^&\s'\"]*",
                             re.I)
# Names of variables, tags and settings that hold secrets (HF_TOKEN, WANDB_API_KEY, AZURE_CLIENT_SECRET,
# extra.db_password; not TOKENIZERS_PARALLELISM): the words, and a last word KEY
_CREDENTIAL_WORDS = {"SECRET", "PASSWORD", "PASSWD", "TOKEN", "SAS", "CREDENTIAL", "CREDENTIALS", "PAT"}


def redact(text: str) -> str:
    """`text` without SAS signatures, bearer tokens, JWTs, storage keys or passwords."""
    for _, pattern, replacement in _CREDENTIALS:
        text = pattern.sub(replacement, text)
    return _SAS_PARAMETERS.sub(r"\1REDACTED", text)


def credential_in(text: str) -> str | None:
    """What kind of credential `text` holds ("a SAS signature, sig="), or None: what `redact` removes, less
    the parts of a SAS URL that are no credential alone."""
    return next((what for what, pattern, _ in _CREDENTIALS if pattern.search(text)), None)


def named_like_credential(name: str) -> bool:
    """True for a name that says it holds a secret: HF_TOKEN, WANDB_API_KEY, extra.db_password,
    AZURE_STORAGE_CONNECTION_STRING (words split at anything but letters and digits)."""
    words = [word for word in re.split(r"[^A-Z0-9]+", name.upper()) if word]
    return bool(_CREDENTIAL_WORDS & set(words)) or words[-1:] == ["KEY"] or "CONNECTION_STRING" in "_".join(
        words)


def redacted_line(exc: BaseException) -> str:
    """An exception as one redacted line: its first non-empty line, prefixed with its type (not for our own
    SubmitError, whose message is already the line). The first line only, unlike core.errors.exception_line:
    the Azure SDKs' later lines are response dumps (headers, bodies) no one-line error should carry. But
    azure-ai-ml's formatted errors (colour codes, then `1) One or more fields are invalid`, `Details:`,
    `(x) WHAT`) are read as their summary and first detail."""
    text = _ANSI.sub("", redact(str(exc))).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else ""
    detail = next((line[4:] for line in lines if line.startswith("(x) ")), None)
    if detail is not None and "Details:" in lines:
        first = f"{first.lstrip('0123456789) ')}: {detail}"
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
