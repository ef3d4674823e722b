"""What a program that runs a training script gives the trainers the script builds, without changing it.

`hvdazure sweep` runs an unmodified user script once per trial inside one process per rank: every Trainer the
script constructs while a RunContext is active starts Horovod on the context's MPI communicator (the trial's
group of ranks, not the whole job), applies the trial's parameters over the script's config, and gets the
context's callbacks (metric reports, pruning). Outside such a program there is no context and nothing
changes. Framework-free: the bindings read it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hvdazure.core.callbacks import Callback
from hvdazure.core.config import ConfigError, TrainConfig


@dataclass
class RunContext:
    """`communicator`: an mpi4py communicator Horovod starts on (None: all ranks of the job).
    `config_overrides`: TrainConfig changes applied over the script's config ("extra" merged key by key).
    `callbacks`: added to each trainer's own. `run_name` and `mlflow_parent_run_id`: an MLflow logger logs
    into a child run of that name under that parent run. `shutdowns`: filled by trainers, see `shut_down`."""

    communicator: Any = None
    config_overrides: Mapping[str, Any] = field(default_factory=dict)
    callbacks: Sequence[Callback] = ()
    run_name: str | None = None
    mlflow_parent_run_id: str | None = None
    shutdowns: list[Callable[[], None]] = field(default_factory=list)

    def apply(self, config: TrainConfig) -> TrainConfig:
        """The script's config with this context's overrides (validated as any config is)."""
        if not self.config_overrides:
            return config
        changes = dict(self.config_overrides)
        if "extra" in changes:
            changes["extra"] = {**config.extra, **changes["extra"]}
        return config.replace(**changes)

    def shut_down(self) -> None:
        """Shut down every Horovod the trainers of this context started, so that the next run starts afresh
        (and a rank whose run failed releases its peers from the collectives they wait in)."""
        while self.shutdowns:
            with contextlib.suppress(Exception):
                self.shutdowns.pop()()


_active: list[RunContext] = []


def current() -> RunContext | None:
    """The innermost active context, or None."""
    return _active[-1] if _active else None


@contextlib.contextmanager
def active(context: RunContext) -> Iterator[RunContext]:
    """Make `context` the one trainers see while the block runs."""
    _active.append(context)
    try:
        yield context
    finally:
        _active.remove(context)


def check_world(communicator: Any, horovod_size: int) -> None:
    """After `hvd.init(comm=...)`: Horovod's world must be the communicator's ranks. Under the Gloo controller
    (horovodrun --gloo) Horovod ignores the communicator and joins every rank: say so on every rank."""
    if communicator is None:
        return
    wanted = communicator.Get_size()
    if horovod_size != wanted:
        raise ConfigError(
            f"Horovod started on {horovod_size} ranks, not the {wanted} of the given communicator: starting "
            "on a communicator needs Horovod's MPI controller (mpirun, or `hvdazure run --mpi`); under Gloo "
            "(horovodrun --gloo) Horovod ignores it")
