"""Python tracebacks in the ranks' output: each shown whole, an error shown once, not once per rank.

A mistake in a user's script usually fails on every rank at the same line, and each rank prints the same
traceback; the launcher forwards them line by line, interleaved. `hvdazure run` reads each rank's stderr
through `Tracebacks`:

- A rank's traceback (from its `Traceback (most recent call last):` line) is held until it is complete:
  the rank ended (its wrapper's last line arrived), or `HOLD_S` passed since its last frame or since its
  error line (a rank that printed a traceback and goes on). Then it is shown whole: two ranks' tracebacks
  never interleave. Every other line streams as it comes.
- The first traceback of an error is shown in full. The same error on another rank (the same lines after
  the frames: exception type and message) is not shown again; the job's summary says which ranks failed
  with it. A different error is shown too, abridged to the user's own frame (the last one outside Python,
  installed packages and hvdazure) and the error. So is a rank's follow-on error (Horovod shut down
  because a peer failed), which says nothing of the cause.
- `verbose`: every traceback in full (still whole).

Pure bookkeeping: lines in, lines to show out, the clock passed in. The supervisor writes what it returns
and keeps every line, shown or not, in the job's log.
"""

from __future__ import annotations

import re
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from hvdazure.launch.exit_status import PEER_SHUTDOWN_MARKERS

HOLD_S = 2.0  # how long a traceback's next line may take to arrive (lines come in a burst: one print)
_MOST_LINES = 5000  # a traceback held longer than this is shown as it is: nothing grows without bound
_HEADERS = ("Traceback (most recent call last):", "Exception Group Traceback (most recent call last):")
_FRAME = re.compile(r'^  File "(?P<path>[^"]*)", line \d+')
# Log lines of TensorFlow's C++ (absl) that a rank may write while it exits: not part of the error.
_NOT_THE_ERROR = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\)"
                            r"|[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] )")
_PEER_SHUTDOWN = tuple(marker.decode() for marker in PEER_SHUTDOWN_MARKERS)
_HVDAZURE_DIR = str(Path(__file__).resolve().parents[1])
_LIBRARY_DIRS = tuple({sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")})


def is_library_file(path: str) -> bool:
    """Whether a frame's file is Python's, an installed package's, hvdazure's or generated (TensorFlow's
    AutoGraph writes converted functions to temporary files): not the user's code."""
    return (path.startswith("<") or "/site-packages/" in path or "/dist-packages/" in path
            or "__autograph_generated_file" in path
            or path.startswith((_HVDAZURE_DIR + "/", *(d + "/" for d in _LIBRARY_DIRS))))


@dataclass
class _Traceback:
    """One rank's traceback as it arrives: its lines as the launcher tagged them, and their text."""

    tag: str  # "[1]<stderr>:"
    tagged: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    last_section: int = 0  # where the last traceback of a chain (`During handling of ...`) starts
    error_from: int | None = None  # where the last section's error lines start (after its frames)
    last_at: float = 0.0
    error_at: float | None = None

    def add(self, text: str, now: float) -> None:
        line = text.rstrip("\n")
        if self.texts and line.startswith(_HEADERS):  # the next exception of a chain
            self.last_section, self.error_from, self.error_at = len(self.texts), None, None
        elif self.error_from is None and self.texts and line.strip() and not line[:1].isspace():
            self.error_from, self.error_at = len(self.texts), now
        self.tagged.append(self.tag + text)
        self.texts.append(line)
        self.last_at = now

    def complete(self, now: float, hold_s: float) -> bool:
        """No line of it came for `hold_s`, or its error came `hold_s` ago (what follows is not it)."""
        return (now - self.last_at >= hold_s or (self.error_at is not None and now - self.error_at >= hold_s)
                or len(self.texts) >= _MOST_LINES)

    @property
    def error(self) -> str | None:
        """The error as it compares across ranks: its lines after the last frame, stripped; None when no
        error line came (an exception group: every line indented)."""
        if self.error_from is None:
            return None
        return "\n".join(t.strip() for t in self.texts[self.error_from:]
                         if t.strip() and not _NOT_THE_ERROR.match(t))

    @property
    def follow_on(self) -> bool:
        return any(marker in text for text in self.texts for marker in _PEER_SHUTDOWN)

    def abridged(self) -> list[str] | None:
        """A header, the user's last frame of the last exception (or its last frame) and the error; None
        when that would leave nothing out."""
        if self.error_from is None:
            return None
        frames = {i: match["path"] for i, text in enumerate(self.texts) if (match := _FRAME.match(text))}
        last = [i for i in frames if self.last_section < i < self.error_from]
        if not last:
            return None
        start = ([i for i in last if not is_library_file(frames[i])] or last)[-1]
        end = next((i for i in last if i > start), self.error_from)
        if start - 1 + self.error_from - end <= 0:  # left out: all but the header, that frame and the error
            return None
        header = (f"{self.tag}Traceback (most recent call last; {len(frames) - 1} of {len(frames)} frames "
                  "not shown):\n")
        return [header, *self.tagged[start:end], *self.tagged[self.error_from:]]


class Tracebacks:
    """Holds each rank's traceback until it is complete, then says what of it to show (see the module)."""

    def __init__(self, verbose: bool = False, hold_s: float = HOLD_S) -> None:
        self.verbose, self.hold_s = verbose, hold_s
        self._held: dict[int, _Traceback] = {}
        self._shown: dict[str, int] = {}  # an error shown -> the rank whose traceback showed it
        self._in_full: set[int] = set()  # ranks whose traceback was shown in full
        self.errors: dict[int, str] = {}  # rank -> its latest error
        self.not_in_full = 0  # tracebacks left out or abridged

    def stderr_line(self, rank: int, tag: str, text: str, now: float) -> list[str]:
        """A line `rank` wrote on stderr (`tag` the launcher's, `text` the rest, with its newline): the
        lines to show now, in order."""
        held = self._held.get(rank)
        shown = []
        if held is not None and held.complete(now, self.hold_s):
            shown, held = self._release(rank), None
        if held is None and text.lstrip(" +").startswith(_HEADERS):
            self._held[rank] = held = _Traceback(tag)
        if held is None:
            return [*shown, tag + text]
        held.add(text, now)
        return shown

    def rank_ended(self, rank: int) -> list[str]:
        """The rank's wrapper said how it ended: its traceback is complete."""
        return self._release(rank) if rank in self._held else []

    def stale(self, now: float) -> list[str]:
        """Tracebacks complete by the clock (their ranks go on, or are slow to exit)."""
        return [line for rank in sorted(self._held) if self._held[rank].complete(now, self.hold_s)
                for line in self._release(rank)]

    def release_all(self) -> list[str]:
        """The output ended: every traceback held is complete."""
        return [line for rank in sorted(self._held) for line in self._release(rank)]

    def same_error_as(self, rank: int) -> list[int]:
        """The other ranks whose latest error is `rank`'s."""
        error = self.errors.get(rank)
        return sorted(r for r, e in self.errors.items() if r != rank and error is not None and e == error)

    def shown_by(self, rank: int) -> int | None:
        """The rank whose traceback showed `rank`'s latest error (None: not shown, or `verbose`)."""
        error = self.errors.get(rank)
        return None if error is None else self._shown.get(error)

    def _release(self, rank: int) -> list[str]:
        traceback = self._held.pop(rank)
        error = traceback.error
        if error is not None:
            self.errors[rank] = error
        if self.verbose or error is None:
            return traceback.tagged
        if self._shown.setdefault(error, rank) != rank:  # another rank's traceback showed this error
            self.not_in_full += 1
            return []
        if traceback.follow_on or self._in_full - {rank}:
            abridged = traceback.abridged()
            if abridged is not None:
                self.not_in_full += 1
                return abridged
        self._in_full.add(rank)
        return traceback.tagged
