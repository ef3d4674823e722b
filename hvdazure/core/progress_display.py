"""Rank 0's live progress display: the epoch's step, loss, metrics and samples/s on one line redrawn in place
(a tqdm bar), where there is a terminal to draw it on; elsewhere (Azure ML's logs, CI, a file) the progress
logger writes a line per log interval instead.

Where it draws:
- One process on a terminal (its stderr is one): tqdm draws on stderr as usual.
- Under `hvdazure run` on a terminal: rank 0's stderr is a pipe to the launcher, never a terminal, so
  `hvdazure run` says so in TERMINAL_ENV (the terminal's width), and each redraw goes out as its text
  ended by a carriage return, one write each, which `hvdazure run` draws in place (launch/console.py).
- Anywhere else: nowhere (`display_width` is None).
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from typing import Any, TextIO

# Set by `hvdazure run` for the ranks when its stderr is a terminal: that terminal's width in columns.
TERMINAL_ENV = "HVDAZURE_TERMINAL_COLUMNS"
_BAR_FORMAT = "{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"


def display_width(env: Mapping[str, str], stream: TextIO) -> int | None:
    """The width to draw the display in: `hvdazure run`'s terminal's, or that of `stream` when it is a
    terminal itself; None where there is no terminal to draw on."""
    value = env.get(TERMINAL_ENV, "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    if stream.isatty():
        return shutil.get_terminal_size().columns
    return None


class _Redraws:
    """The file tqdm writes to under `hvdazure run`: each redraw (tqdm writes `\\r` + text + padding) goes
    out as its text ended by a carriage return instead, in one write, which the launcher passes on at once
    (it tags and forwards a segment when it ends, and tqdm's would end only at its next redraw)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.encoding = getattr(stream, "encoding", None)  # tqdm asks it before drawing block characters

    def write(self, text: str) -> int:
        if text.startswith("\r"):
            text = text[1:].rstrip(" ") + "\r"
        if text:
            self.stream.write(text)
            self.stream.flush()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def epoch_bar(stream: TextIO, width: int, supervised: bool, total: int, initial: int, desc: str) -> Any:
    """A tqdm bar of an epoch's `total` steps, `initial` done, on `stream`, `width` columns wide; through
    `hvdazure run` (`supervised`: its redraws as launch/console.py reads them) or straight to a terminal.
    Closed, it leaves nothing: the epoch's line takes its place."""
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, file=_Redraws(stream) if supervised else stream,
                ncols=max(width - 1, 20), bar_format=_BAR_FORMAT, leave=False, dynamic_ncols=not supervised)
