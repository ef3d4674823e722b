"""How an exception is shown in one line: where a message must fit one line (a rank's error on every rank,
a sweep trial's result), the exception's type and all of its message, its lines joined.

The type says what kind of failure it was (`KeyError: 'fc.weight'` against a bare `'fc.weight'`), and no
line is dropped: torch's load_state_dict errors put what is missing on the lines after the first.
"""

from __future__ import annotations


def exception_line(exc: BaseException) -> str:
    """``exc`` as ``Type: message``, the message's non-blank lines stripped and joined by spaces; the type
    alone when the message is empty."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
