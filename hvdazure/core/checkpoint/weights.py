"""One file of a checkpoint, verified, for the bindings' `load_weights`: weights without the trainer.

A binding names its model file and loads it; this finds the checkpoint (one checkpoint's directory, or the
`latest` or `best` of a directory of them, as CheckpointManager.resolve chooses), verifies it, and hands
over a local path, with the one-line errors both bindings share. Every file of the chosen checkpoint is read
once, through its hash, before the path is yielded (CheckpointManager.open_valid).

A checkpoint is a directory (a manifest.json beside its files). A single file named instead (a `.pt`, a
`.keras`, a `.safetensors` from elsewhere) holds weights hvdazure did not write: `refuse_a_file` says what
it is and how to load it in build_model, instead of failing on a manifest a file cannot hold.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from hvdazure.core.checkpoint.integrity import CheckpointError, storage_call
from hvdazure.core.checkpoint.store import Checkpoint, CheckpointManager
from hvdazure.core.object_store import filesystem, redact


class NotACheckpoint(CheckpointError):
    """A file was named as a checkpoint: bad input (exit status 2), not a damaged checkpoint."""

    exit_status = 2


# What a model file from elsewhere is, by its name's ending, and how a training script loads it
_IN_BUILD_MODEL = "load it in build_model: "
_MODEL_FILES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    ((".safetensors",), "a safetensors file",
     _IN_BUILD_MODEL + "model.load_state_dict(safetensors.torch.load_file(path))"),
    ((".pt", ".pth", ".bin"), "a PyTorch file",
     _IN_BUILD_MODEL + "model.load_state_dict(torch.load(path, weights_only=True))"),
    ((".keras",), "a Keras model file", _IN_BUILD_MODEL + "return keras.models.load_model(path)"),
    ((".h5", ".hdf5"), "a Keras HDF5 file", _IN_BUILD_MODEL + "model.load_weights(path)"),
    ((".onnx",), "an ONNX model",
     "hvdazure runs PyTorch and Keras models; serve an ONNX one with onnxruntime"),
)
_ANY_FILE = ("a file", "a model file from elsewhere is loaded in build_model (torch.load, "
                       "keras.models.load_model)")


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
        refuse_a_file(checkpoint)
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
    refuse_a_file(checkpoint)
    config = manager.open(checkpoint, verify=False).manifest.get("config")
    return config if isinstance(config, dict) else {}


def refuse_a_file(checkpoint: str, then: str = "") -> None:
    """A NotACheckpoint if `checkpoint` (a path or URL) is a file, not a directory: one line saying what the
    file is by its name (a PyTorch, safetensors or Keras file) and how to load it in build_model, then
    `then` (how the caller goes on). Nothing if it is a directory or does not exist."""
    fs, root = filesystem(checkpoint)
    if not storage_call(fs, f"looking at {redact(checkpoint)}", lambda: fs.isfile(root)):
        return
    name = root.rstrip("/").rsplit("/", 1)[-1].lower()
    kind, how = next(((kind, how) for endings, kind, how in _MODEL_FILES if name.endswith(endings)),
                     _ANY_FILE)
    raise NotACheckpoint(f"{redact(checkpoint)} is {kind}, not an hvdazure checkpoint (a directory with a "
                         f"manifest.json): {how}{then}")


def _run_config(manager: CheckpointManager, candidates: list[Checkpoint]) -> dict[str, Any]:
    config = manager._of_current_run(candidates)[-1].manifest.get("config")
    return config if isinstance(config, dict) else {}


def _refuse_missing(manager: CheckpointManager, checkpoint: str) -> None:
    if not manager.exists():
        raise CheckpointError(f"{redact(checkpoint)}: no such directory")


def _short(value: object) -> str:
    """A value for a one-line error: a string or number as it is, anything else (a model) by its type."""
    return repr(value) if isinstance(value, str | int | float | None) else f"a {type(value).__name__}"
