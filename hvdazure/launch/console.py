"""What `hvdazure run` shows of the ranks' output: rank 0's as a 1-process run shows it, another rank's
marked with its rank, and one line redrawn in place on a terminal.

The launchers tag every line of a rank's output with its rank and stream (mpirun `[1,0]<stderr>:`,
horovodrun `[0]<stderr>:`); the supervisor (launch/supervisor.py) reads the tags to route each line and to
find tracebacks and failures, and shows the lines here, the tag rewritten: none for rank 0, `[rank 1] ` for
rank 1. A rank's stdout goes to `hvdazure run`'s stdout, its stderr to its stderr.

A line a rank ends with a carriage return (`\\r`) instead of a newline is a redraw: a progress display
moving. Output flows a segment at a time, each ended by either (`Segments`: the rank wrapper passes each on
as it comes, and both launchers tag a segment so ended at once). On a terminal, rank 0's redraws are drawn
in place (`Console.redraw`): a line of any rank written meanwhile clears the redrawn line, is written, and
the redrawn line is drawn again under it. Elsewhere (a file, a pipe: Azure ML's logs, CI), and for other
ranks, a redrawn line is shown only in its last state, when its rank ends it with a newline: no carriage
return and no terminal control code is ever written there.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from typing import TextIO

_SEGMENT_END = re.compile(rb"\r\n|\r|\n")
_CLEAR_LINE = "\r\x1b[K"  # to the line's start, and erase it


class Segments:
    """Cuts a byte stream into segments as it arrives, each ended by a newline or a carriage return (a
    `\\r\\n` pair ends one); what follows the last end waits for the next chunk, or for `end()`."""

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The segments `chunk` completes, in order."""
        data, start, segments = self._tail + chunk, 0, []
        for match in _SEGMENT_END.finditer(data):
            segments.append(data[start:match.end()])
            start = match.end()
        self._tail = data[start:]
        return segments

    def end(self) -> list[bytes]:
        """The stream ended: what is left, unended."""
        tail, self._tail = self._tail, b""
        return [tail] if tail else []


def rank_prefix(rank: int) -> str:
    """How a rank's lines are marked: not at all for rank 0 (as a 1-process run prints them), `[rank N] `
    for any other."""
    return "" if rank == 0 else f"[rank {rank}] "


def is_redraw(text: str) -> bool:
    """Whether a segment is a redraw: ended by a carriage return alone."""
    return text.endswith("\r") and not text.endswith("\r\n")


@dataclass
class _Redrawn:
    """A line being redrawn: its rank, and its latest text on one of the two streams."""

    rank: int
    stream: TextIO
    text: str


class Console:
    """Writes what the ranks print to `hvdazure run`'s stdout and stderr (see the module). `terminal`: its
    stderr is a terminal, where rank 0's redraws are drawn in place."""

    def __init__(self, terminal: bool) -> None:
        self.terminal = terminal
        self._live: _Redrawn | None = None  # rank 0's line drawn in place (terminal only)
        self._held: dict[tuple[int, int], _Redrawn] = {}  # (rank, id(stream)) -> its last redraw, unshown

    def write(self, stream: TextIO, lines: list[str]) -> None:
        """Write whole lines (each with its newline) to `stream`, under a line being redrawn."""
        if not lines:
            return
        if self._live is not None:
            self._clear(self._live.stream)
        stream.write("".join(lines))
        stream.flush()
        if self._live is not None:
            self._draw(self._live)

    def redraw(self, rank: int, stream: TextIO, text: str) -> None:
        """`rank` redraws its line on `stream` (the text without its carriage return)."""
        text = text.rstrip("\b")  # backspaces that the carriage return makes moot (Keras' progress bar)
        redrawn = _Redrawn(rank, stream, text)
        if not (self.terminal and rank == 0):
            self._held[(rank, id(stream))] = redrawn
            return
        if self._live is not None and self._live.stream is not stream:
            self._clear(self._live.stream)
        if text.strip():
            self._live = redrawn
            self._draw(redrawn)
        else:  # an empty redraw clears the line
            self._clear(stream)
            self._live = None

    def line_ends(self, rank: int, stream: TextIO, text: str) -> bool:
        """`rank` writes a line (`text`, with its newline) on `stream`. A line it was redrawing there ends:
        kept as it last was when `text` is empty (True: `text` is written thereby), else replaced by
        `text` (False: the caller writes it)."""
        held = self._held.pop((rank, id(stream)), None)
        live = self._live if self._live is not None and (self._live.rank, self._live.stream) == (
            rank, stream) else None
        if live is None and held is None:
            return False
        if live is not None:
            self._live = None
            if text.strip():
                self._clear(stream)
                return False
            stream.write("\n")
            stream.flush()
            return True
        assert held is not None
        if text.strip() or not held.text.strip():
            return False
        self.write(stream, [f"{rank_prefix(rank)}{held.text}\n"])
        return True

    def close(self) -> None:
        """The output ended: a line still being redrawn stays as it last was, and what follows starts on a
        line of its own."""
        if self._live is not None:
            self._live.stream.write("\n")
            self._live.stream.flush()
        self._live = None
        self._held.clear()

    def _draw(self, redrawn: _Redrawn) -> None:
        """Draw a line in place, cut to the terminal's width (a wrapped line could not be redrawn)."""
        redrawn.stream.write(_CLEAR_LINE + redrawn.text[:max(_columns(redrawn.stream) - 1, 1)])
        redrawn.stream.flush()

    @staticmethod
    def _clear(stream: TextIO) -> None:
        stream.write(_CLEAR_LINE)
        stream.flush()


def _columns(stream: TextIO) -> int:
    """The width of the terminal `stream` writes to, as it is now (it may have been resized)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return shutil.get_terminal_size().columns
