"""Point-to-point messages between a sweep's ranks (mpi4py), waited for by polling.

Open MPI's blocking receives spin a core while they wait. A group waiting for its next trial, or ranks done
before the last trial ends, would take cores from the trials still training; these waits poll and sleep
instead. Only point-to-point messages (and one barrier at the end) travel on communicators of their own,
never Horovod's, so nothing here can interleave with a trial's collectives.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

TAG_REQUEST = 11  # a group leader to the coordinator
TAG_REPLY = 12  # the coordinator's answer
TAG_ASSIGN = 13  # a group leader to its members: the next trial
TAG_OUTCOME = 14  # a member to its leader: how the trial ended on that rank

_MAX_SLEEP_S = 0.02


def wait_until(ready: Callable[[], Any], max_sleep_s: float = _MAX_SLEEP_S) -> None:
    """Poll `ready` with sleeps doubling from 0.5 ms up to `max_sleep_s`, instead of a blocking MPI call."""
    sleep = 0.0005
    while not ready():
        time.sleep(sleep)
        sleep = min(sleep * 2, max_sleep_s)


def receive(comm: Any, source: int, tag: int) -> Any:
    """The next message from `source` with `tag`, waiting without spinning a core."""
    from mpi4py import MPI

    wait_until(lambda: comm.Iprobe(source=source, tag=tag))
    return comm.recv(source=source, tag=tag, status=MPI.Status())


def request(comm: Any, message: dict[str, Any], coordinator: int = 0) -> dict[str, Any]:
    """Send a request to the coordinator and wait for its reply."""
    comm.send(message, dest=coordinator, tag=TAG_REQUEST)
    return receive(comm, coordinator, TAG_REPLY)


def barrier(comm: Any) -> None:
    """Every rank of `comm` got here; ranks that are done wait without spinning a core."""
    pending = comm.Ibarrier()
    wait_until(pending.Test, _MAX_SLEEP_S * 5)
