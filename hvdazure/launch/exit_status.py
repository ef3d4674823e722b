"""How a rank's start and end are described: written by the rank wrapper, read back by the supervisor.

When one rank dies, its peers usually fail too, a moment later, with Horovod's "has been shut down" error.
Each failure line therefore carries the time of the exit and whether it was such a follow-on failure, so
the supervisor can name the rank that failed first rather than whichever line reached it first. The time is
wall-clock seconds (ranks on other nodes share no other clock); users are shown it as seconds after the
job started (`with_time_since_start`).

Every rank also says where it started and, unless it failed, that it exited (`started_line`,
`exited_line`; the supervisor reads and hides them). A rank that started and never said how it ended was
lost with its wrapper: killed outright, or on a node that went down or was cut off. That is how a lost
node is told apart from its peers, which fail only because it went away.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Collection, Mapping
from dataclasses import dataclass

# Horovod's message on the surviving ranks after a peer exited or crashed.
PEER_SHUTDOWN_MARKERS = (b"Horovod has been shut down", b"HorovodInternalError")
# Gloo's error when another rank did not answer for HOROVOD_GLOO_TIMEOUT_SECONDS (default 30): the network
# between nodes is down, or that rank is frozen. A rank failing so is a root cause, not a follow-on.
PEER_TIMEOUT_MARKER = b"Timed out waiting"
PEER_TIMEOUT_DETAIL = (" (timed out waiting for another rank: the network between nodes is down, or that "
                       "rank is frozen; HOROVOD_GLOO_TIMEOUT_SECONDS sets how long Gloo waits)")
_FOLLOW_ON = " (after a peer rank stopped)"
_STARTED = re.compile(r"hvdazure: rank (?P<rank>\d+) started on (?P<host>\S+)$")
_EXITED = re.compile(r"hvdazure: rank (?P<rank>\d+) exited with code \d+$")
_FAILED = re.compile(
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
        match = _FAILED.search(line)
        if match is None:
            return None
        detail = match["detail"]
        follow_on = detail.endswith(_FOLLOW_ON)
        if follow_on:
            detail = detail[: -len(_FOLLOW_ON)]
        return cls(follow_on, float(match["time"]), int(match["rank"]), int(match["code"]), detail)


def started_line(rank: int, host: str) -> str:
    """The line a rank wrapper prints when it starts its command."""
    return f"hvdazure: rank {rank} started on {host}"


def exited_line(rank: int, code: int) -> str:
    """The line a rank wrapper prints when its command ended without failing (or as the launcher asked)."""
    return f"hvdazure: rank {rank} exited with code {code}"


def parse_started(line: str) -> tuple[int, str] | None:
    """(rank, host) from a (possibly rank-tagged) started line, else None."""
    match = _STARTED.search(line.rstrip("\n"))
    return (int(match["rank"]), match["host"]) if match else None


def parse_exited(line: str) -> int | None:
    """The rank of a (possibly rank-tagged) exited line, else None."""
    match = _EXITED.search(line.rstrip("\n"))
    return int(match["rank"]) if match else None


def lost_node(hosts: Mapping[int, str], exited: Collection[int], here: str) -> tuple[str, list[int]] | None:
    """A node other than `here` none of whose ranks said how it ended, with its ranks: that node, or the
    network to it, went down. `hosts` maps each rank that started to its host; `exited` holds the ranks that
    said how they ended. (A rank can miss saying it when the launcher kills it while tearing the job down,
    but every rank of a node only when the node is gone or cut off.) The lowest-ranked such node, or None."""
    by_host: dict[str, list[int]] = {}
    for rank, host in sorted(hosts.items()):
        by_host.setdefault(host, []).append(rank)
    lost = [(host, ranks) for host, ranks in by_host.items() if host != here and not set(exited) & set(ranks)]
    return min(lost, key=lambda item: item[1][0]) if lost else None


def with_time_since_start(line: str, started_at: float) -> str:
    """A failure line as users read it: its time as seconds after `started_at` (epoch seconds), not as a
    raw timestamp. Other lines are returned as they are."""
    match = _FAILED.search(line)
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
