"""One file of a checkpoint, verified, for the bindings' `load_weights`: weights without the trainer.

A binding names its model file and loads it; this finds the checkpoint (one checkpoint's directory, or the
`latest` or `best` of a directory of them, as CheckpointManager.resolve chooses), verifies it, and hands
over a local path, with the one-line errors both bindings share. Every file of the chosen checkpoint is read
once, through its hash, before the path is yielded (CheckpointManager.open_valid).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from hvdazure.core.checkpoint_integrity import CheckpointError
from hvdazure.core.checkpoint_store import Checkpoint, CheckpointManager
from hvdazure.core.object_store import redact


@contextlib.contextmanager
def exported_file(checkpoint: str, which: str, file_name: str) -> Iterator[str]:
    """A verified local copy (or the verified file in place) of `file_name` of a checkpoint, for loading
    weights without the trainer. `checkpoint` is one checkpoint's directory (path or URL), or a directory of
    checkpoints whose `which` is taken: "latest", or "best" by the monitor the run was configured with (of
    the run `latest` belongs to). Every file of the checkpoint is verified before the path is yielded. The
    bindings' `load_weights` share it, and its one-line errors (a directory that does not exist is named as
    such)."""
    with exported_checkpoint(checkpoint, which, file_name) as (_, path):
        yield path


@contextlib.contextmanager
def exported_checkpoint(checkpoint: str, which: str, file_name: str) -> Iterator[tuple[Checkpoint, str]]:
    """`exported_file`, with the checkpoint it chose (to say which one was loaded)."""
    if not isinstance(checkpoint, str) or which not in ("latest", "best"):  # e.g. load_weights(path, model)
        raise CheckpointError(f"checkpoint={_short(checkpoint)}, which={_short(which)}: a checkpoint's path "
                              "or URL (a str) and which 'latest' or 'best'")
    manager = CheckpointManager(checkpoint)
    candidates = manager.checkpoints()
    if not candidates:  # `checkpoint` is itself one checkpoint's directory
        _refuse_missing(manager, checkpoint)
        which = checkpoint
    elif which == "best":  # the monitor the current run was configured with, as its newest checkpoint records
        config = _run_config(manager, candidates)
        manager = CheckpointManager(checkpoint, monitor=config.get("monitor"),
                                    mode=config.get("monitor_mode", "min"))
    with manager.open_valid(which, [file_name]) as (chosen, paths):
        yield chosen, paths[file_name]


def recorded_config(checkpoint: str) -> dict[str, Any]:
    """The TrainConfig fields (a dict) that the run of `checkpoint` (one checkpoint's directory, or a
    directory of them: its current run, the one `latest` and `best` choose from) was trained with, as its
    newest checkpoint's manifest records them; {} where it records none. Only the manifest is read: the
    files are verified when they are loaded. A CheckpointError for a directory that does not exist or holds
    no readable checkpoint."""
    manager = CheckpointManager(checkpoint)
    candidates = manager.checkpoints()
    if candidates:
        return _run_config(manager, candidates)
    _refuse_missing(manager, checkpoint)
    config = manager.open(checkpoint, verify=False).manifest.get("config")
    return config if isinstance(config, dict) else {}


def _run_config(manager: CheckpointManager, candidates: list[Checkpoint]) -> dict[str, Any]:
    config = manager._of_current_run(candidates)[-1].manifest.get("config")
    return config if isinstance(config, dict) else {}


def _refuse_missing(manager: CheckpointManager, checkpoint: str) -> None:
    if not manager.exists():
        raise CheckpointError(f"{redact(checkpoint)}: no such directory")


def _short(value: object) -> str:
    """A value for a one-line error: a string or number as it is, anything else (a model) by its type."""
    return repr(value) if isinstance(value, str | int | float | None) else f"a {type(value).__name__}"
