"""How a rank's failure is described: written by the rank wrapper, read back by the supervisor.

When one rank dies, its peers usually fail too, a moment later, with Horovod's "has been shut down" error.
Each failure line therefore carries the time of the exit and whether it was such a follow-on failure, so
the supervisor can name the rank that failed first rather than whichever line reached it first. The time is
wall-clock seconds (ranks on other nodes share no other clock); users are shown it as seconds after the
job started (`readable`).
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

# Horovod's message on the surviving ranks after a peer exited or crashed.
PEER_SHUTDOWN_MARKERS = (b"Horovod has been shut down", b"HorovodInternalError")
_FOLLOW_ON = " (after a peer rank stopped)"
_PATTERN = re.compile(
    r"hvdazure: rank (?P<rank>\d+) failed with exit code (?P<code>\d+)(?P<detail>.*)"
    r"(?P<at> at (?P<time>\d+\.\d+))"
)


@dataclass(frozen=True, order=True)
class RankFailure:
    """One rank's non-zero exit. Orders root causes first, then by time."""

    follow_on: bool
    time: float
    rank: int
    code: int
    detail: str = ""

    def line(self) -> str:
        """The line the rank wrapper prints on stderr."""
        note = _FOLLOW_ON if self.follow_on else ""
        return (f"hvdazure: rank {self.rank} failed with exit code {self.code}{self.detail}{note}"
                f" at {self.time:.6f}")

    @classmethod
    def parse(cls, line: str) -> RankFailure | None:
        """The failure a (possibly rank-tagged) output line reports, or None."""
        match = _PATTERN.search(line)
        if match is None:
            return None
        detail = match["detail"]
        follow_on = detail.endswith(_FOLLOW_ON)
        if follow_on:
            detail = detail[: -len(_FOLLOW_ON)]
        return cls(follow_on, float(match["time"]), int(match["rank"]), int(match["code"]), detail)


def readable(line: str, started_at: float) -> str:
    """A failure line as users read it: its time as seconds after `started_at` (epoch seconds), not as a
    raw timestamp. Other lines are returned as they are."""
    match = _PATTERN.search(line)
    if match is None:
        return line
    elapsed = float(match["time"]) - started_at
    return f"{line[:match.start('at')]} ({elapsed:.1f}s after start){line[match.end('at'):]}"


def exit_code_of(returncode: int) -> tuple[int, str]:
    """Shell-style exit code (128 + N for a process killed by signal N) and a description of the signal."""
    if returncode >= 0:
        return returncode, ""
    sig = -returncode
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    return 128 + sig, f" (killed by {name})"
