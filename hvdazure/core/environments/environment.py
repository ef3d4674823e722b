"""What every cluster environment answers, and the readers of the launcher variables they share.

An environment is one small class (Lightning Fabric's ``plugins/environments`` pattern) that answers the
questions the trainer would otherwise settle by comparing launcher names: is this process mine, where in the
job is it, where do checkpoints go when none are configured, which job is it (the same when run again),
where are dataset shards cached, and where and how is a preemption announced ahead of time
(`PreemptionNotices`, or None). An environment only reports: the core acts on what it says (the trainer's
PreemptionWatcher polls the notices; core/preemption_watcher.py). Detection and description are pure
functions of the environment mapping handed in.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ClusterInfo:
    """This process's place in the job: global and per-node rank, node, master address and launcher."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    node_rank: int
    num_nodes: int
    master_addr: str | None
    launcher: str  # "azureml", "horovodrun", "openmpi", "mpich" or "single"

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the one process that should print, log and save."""
        return self.rank == 0

    @property
    def is_multi_node(self) -> bool:
        """True when the job spans more than one node."""
        return self.num_nodes > 1


@dataclass(frozen=True)
class PreemptionNotice:
    """An advance notice that this node is about to be taken away: what it is (for the checkpoint's reason)
    and its details (for the log line)."""

    reason: str  # e.g. "Azure preemption notice for vm-0"
    detail: str  # e.g. "event E1, Scheduled, not before 2026-04-11T22:26:58+00:00"


class PreemptionNotices(Protocol):
    """Where and how an environment announces a preemption ahead of time: something to poll from one thread
    per node. `poll_seconds` between reads; the first read may take `first_timeout` seconds, later ones
    `timeout`; `where` names the source in log lines."""

    where: str
    poll_seconds: float
    first_timeout: float
    timeout: float

    def due_notice(self, timeout: float) -> PreemptionNotice | None:
        """A notice for this node that is due to be acted on now, or None; raises on a failed read."""
        ...

    def watching(self) -> str:
        """What is watched, once a read has answered (e.g. "Azure Scheduled Events for vm-0")."""
        ...


class Environment(Protocol):
    """One launcher or platform: whether it started this process, where it put it, and its own policies."""

    name: str

    def detected(self, env: Mapping[str, str]) -> bool:
        """True if this environment's variables are in ``env``."""
        ...

    def describe(self, env: Mapping[str, str]) -> ClusterInfo:
        """Where this environment put the process; ValueError, naming the variable, on a malformed value."""
        ...

    def default_checkpoint_dir(self) -> str | None:
        """Where checkpoints go when ``checkpoint_dir`` is not configured; None: nowhere (no checkpoints)."""
        ...

    def job_id(self, env: Mapping[str, str]) -> str | None:
        """An id of this job that stays the same when the scheduler runs the job again (after a preemption),
        so that the job knows its own checkpoints from another run's; None where the launcher has none."""
        ...

    def default_cache_dir(self, env: Mapping[str, str]) -> str:
        """Where a node keeps the shards of remote datasets (hvdazure.data's cache): a directory on a local
        disk that every process of the node sees. HVDAZURE_CACHE_DIR overrides it (see default_cache_dir)."""
        ...

    def preemption_notices(self, watch: bool | None, notices_url: str | None) -> PreemptionNotices | None:
        """Where and how this environment announces a preemption ahead, or None when there is nothing to
        watch. ``watch`` is the config's ``preemption_watch`` (None: this environment's default);
        ``notices_url`` the config's override of where notices are read (None: the environment's own)."""
        ...


def home_cache_dir(env: Mapping[str, str]) -> str:
    """~/.cache/hvdazure/shards (XDG_CACHE_HOME/hvdazure/shards where that is set)."""
    root = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(root, "hvdazure", "shards")


def _int(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name)
    if raw is None:
        raise ValueError(f"{name} is not set")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def read_count(env: Mapping[str, str], name: str) -> int:
    """The positive integer variable ``name``."""
    value = _int(env, name)
    if value < 1:
        raise ValueError(f"{name}={value} must be at least 1")
    return value


def read_index(env: Mapping[str, str], name: str, count: int, count_is: str) -> int:
    """The variable ``name`` as an index below ``count`` (``count_is`` says where the count came from)."""
    value = _int(env, name)
    if not 0 <= value < count:
        raise ValueError(f"{name}={value} must be in 0..{count - 1} ({count_is})")
    return value


def read_per_node(env: Mapping[str, str], name: str, size: int, size_name: str) -> int:
    """The processes-per-node variable ``name``: at least 1 and at most the job's ``size``."""
    local_size = read_count(env, name)
    if local_size > size:
        raise ValueError(f"{name}={local_size} is more than {size_name}={size}")
    return local_size


def node_of_rank(rank: int, size: int, local_size: int) -> tuple[int, int]:
    """(node rank, number of nodes) of ``rank`` when no variable names them."""
    # Ranks are numbered node by node (mpirun -map-by slot, which our launcher uses, hydra's default, Azure
    # ML's per-process launch), so node n holds ranks n * local_size .. (n + 1) * local_size - 1. Wrong for
    # -map-by node, and no launcher variable says which mapping was used.
    return rank // local_size, math.ceil(size / local_size)
