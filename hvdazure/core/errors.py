"""Errors in one line. `UserError` is a mistake in what the user gave (a config value, a checkpoint, the
data, what a hook returned): its message already names the bad value and the way on, so uncaught it ends the
script as that one line, not a traceback (`show_user_errors_in_one_line`, installed by `import hvdazure`).
`exception_line` is any exception in one line, where a message must fit one (a rank's error on every rank, a
sweep trial's result): the exception's type and all of its message, its lines joined.

The type says what kind of failure it was (`KeyError: 'fc.weight'` against a bare `'fc.weight'`), and no
line is dropped: torch's load_state_dict errors put what is missing on the lines after the first.
"""

from __future__ import annotations

import sys
from types import TracebackType


class UserError(Exception):
    """A mistake in the user's input, shown as `hvdazure: error: MESSAGE` when it ends the script.
    `exit_status` 2 is bad input: the launcher then lets every rank say it before it stops the job."""

    exit_status = 2


def show_user_errors_in_one_line() -> None:
    """Make an uncaught UserError print as one line and exit with its `exit_status`; every other exception
    goes to the hook that was there before. Code that catches them is unaffected. Idempotent."""
    previous = sys.excepthook
    if getattr(previous, "hvdazure", False):
        return

    def hook(kind: type[BaseException], error: BaseException, traceback: TracebackType | None) -> None:
        if issubclass(kind, UserError):
            sys.stderr.write(f"hvdazure: error: {error}\n")
            status = error.exit_status  # type: ignore[attr-defined]
            if status != 1:  # Python exits with a SystemExit raised here (else 1)
                raise SystemExit(status)
        else:
            previous(kind, error, traceback)

    hook.hvdazure = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def exception_line(exc: BaseException) -> str:
    """``exc`` as ``Type: message``, the message's non-blank lines stripped and joined by spaces; the type
    alone when the message is empty."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
