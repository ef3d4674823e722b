"""Where this process sits in a distributed job, and what its environment decides, read from the variables
its launcher set.

Usable before ``hvd.init()`` (for example to print only on rank 0 while starting up) and free of any framework
import. Each environment is one small class answering "am I in this environment, what is my rank, where do
checkpoints go, where does a node cache dataset shards, where and how is a preemption announced"
(environment.py; the pattern of Lightning Fabric's ``plugins/environments``): the plain launchers in
launchers.py, Azure ML in azureml.py with the Scheduled Events it reports (scheduled_events.py). They answer
and never act: the trainer detects its environment once, when it starts, and acts on the answers (its
PreemptionWatcher: core/preemption_watcher.py). ``detect_environment`` asks them in priority order, so the
trainer asks the environment and never names one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from hvdazure.core.environments.azureml import INNER_LAUNCHERS, AzureML
from hvdazure.core.environments.environment import (
    ClusterInfo,
    Environment,
    PreemptionNotice,
    PreemptionNotices,
)
from hvdazure.core.environments.launchers import SingleProcess

__all__ = [
    "CACHE_DIR_VARIABLE",
    "ENVIRONMENTS",
    "ClusterInfo",
    "Environment",
    "PreemptionNotice",
    "PreemptionNotices",
    "default_cache_dir",
    "detect_cluster",
    "detect_environment",
]

# Azure ML first because it wraps another launcher's variables; a single process is the fallback.
CACHE_DIR_VARIABLE = "HVDAZURE_CACHE_DIR"  # where the shard cache goes, whatever the environment
ENVIRONMENTS: tuple[Environment, ...] = (AzureML(), *INNER_LAUNCHERS, SingleProcess())


def detect_environment(env: Mapping[str, str] | None = None) -> Environment:
    """The environment that started this process, from ``env`` (default ``os.environ``) and nothing else."""
    env = os.environ if env is None else env
    return next(environment for environment in ENVIRONMENTS if environment.detected(env))


def detect_cluster(env: Mapping[str, str] | None = None) -> ClusterInfo:
    """Describe this process's place in the job from ``env`` (default ``os.environ``) and nothing else."""
    env = os.environ if env is None else env
    return detect_environment(env).describe(env)


def default_cache_dir(env: Mapping[str, str] | None = None) -> str:
    """Where this node caches the shards of remote datasets: HVDAZURE_CACHE_DIR when set, else the
    environment's choice (Azure ML: the node's local SSD; elsewhere ~/.cache/hvdazure/shards)."""
    env = os.environ if env is None else env
    return env.get(CACHE_DIR_VARIABLE) or detect_environment(env).default_cache_dir(env)
