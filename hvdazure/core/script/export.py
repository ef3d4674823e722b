"""A training script's model, exported from a checkpoint: what `hvdazure export CHECKPOINT OUTPUT --script
train.py` and `python train.py export --checkpoint C --output OUTPUT` (Trainer.main) share, one path for
both. They differ only in how they get the trainer class (the CLI imports the script without running its
training: core/trainer_classes.py; main() is the class's own) and how the checkpoint is named.

The policy, in plain words:

- **The configuration** is the one the checkpoint's run was trained with (its manifest records every
  field, `extra` included), then `--config` and `--set` over it: build_model makes the model those weights
  were trained in, whatever the script's defaults say now. Where a checkpoint records none, the script's
  defaults (main's) are the base.
- **The weights** are the checkpoint's model file, verified against the manifest and loaded as predict and
  test load them (Horovod at one rank); nothing is trained, and neither the optimizer state nor the
  evaluation data is read.
- **The example input** the export traces (PyTorch) and checks the reloaded artifact on (every format) is
  the model's own input on the training data's first batch, as the trainer's step gives it to the model
  (trainer.export); `--example FILE` gives another: a .npy file holds the model's one input, a .npz file
  several, in the order they were saved (PyTorch: positional inputs; Keras: the list a multi-input model
  takes).
- **The format** is `--format`, else read from the output's name: .onnx, .pt2 (exported_program), .pt
  (torchscript), .keras, or a name without a suffix (saved_model, a directory); the trainer's binding
  must write it.
- **The output** is refused if it exists, unless `overwrite`; the artifact is written under a temporary
  name, reloaded and compared with the model, and renamed into place only if it computes what the model
  does: a failed export leaves nothing behind.
- **One process**: a launcher's several ranks are refused (each would write the same file).

Every refusal is a UserError, one line (exit status 2 from the command line).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hvdazure.core.checkpoint.trainer_checkpoints import checkpoint_location
from hvdazure.core.checkpoint.weights import recorded_config
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.environments import detect_cluster, detect_environment
from hvdazure.core.script.model_export import Exported, ExportError
from hvdazure.core.training_loop import loop_of

FORMAT_BY_SUFFIX = {".onnx": "onnx", ".pt2": "exported_program", ".pt": "torchscript", ".keras": "keras",
                    "": "saved_model"}


@dataclass(frozen=True)
class ExportRequest:
    """What to export: `which` ("latest" or "best") of `checkpoint` (a directory of checkpoints, or one
    checkpoint's directory: a path or URL), to `output` in `format` (None: by the output's name), checked
    on `example` (a .npy/.npz file; None: the training data's first batch)."""

    checkpoint: str
    which: str
    output: str
    format: str | None = None
    example: str | None = None
    overwrite: bool = False


@dataclass(frozen=True)
class CheckpointExport:
    """An export from a checkpoint: what was written, and the checkpoint whose weights it holds."""

    exported: Exported
    checkpoint: str  # its URL (credentials redacted)

    def describe(self) -> str:
        """One line for a person."""
        return f"{self.exported.describe()}; weights of checkpoint {self.checkpoint}"

    def as_dict(self) -> dict[str, Any]:
        """For --json."""
        return {**dataclasses.asdict(self.exported), "checkpoint": self.checkpoint}


def export_checkpoint(trainer_class: Callable[[TrainConfig], Any], request: ExportRequest,
                      config_args: Sequence[str] = (), defaults: Mapping[str, Any] | None = None,
                      ) -> CheckpointExport:
    """Build `trainer_class` with the checkpoint's recorded config (over `defaults`, under `config_args`:
    --config / --set), load the checkpoint's weights and export the model as `request` asks (the module's
    policy). Every refusal is a one-line UserError, raised before the ranks start where it can be."""
    _refuse_several_ranks()
    _check_output(request.output, request.overwrite)
    example = read_example(request.example) if request.example is not None else None
    if request.which not in ("latest", "best"):
        raise ConfigError(f"--which {request.which!r}: latest or best")
    recorded = {k: v for k, v in recorded_config(request.checkpoint).items() if k in _FIELDS}
    config = TrainConfig._from_cli(list(config_args), {**(defaults or {}), **recorded})
    # the checkpoint named here is the one loaded, whatever checkpoint_dir its run had
    config = config.replace(checkpoint_dir=request.checkpoint)
    trainer = trainer_class(config)
    loop = loop_of(trainer)
    format = _format(request, loop.backend.export_formats, loop.backend.framework_name)
    chosen = loop.ready_for_inference("export", request.which)
    exported: Exported = trainer.export(request.output, format, example)
    return CheckpointExport(exported, chosen or request.checkpoint)


def export_request(checkpoint: str, output: str, config_args: Sequence[str], defaults: Mapping[str, Any],
                   **options: Any) -> ExportRequest:
    """The ExportRequest of a script's `export --checkpoint C`: "latest" or "best" of the checkpoint
    directory its config names (the environment's by default, as predict/test take it), or a path or URL
    (one checkpoint, or a directory of them: its latest). `options`: ExportRequest's format, example,
    overwrite."""
    directory = TrainConfig._from_cli(list(config_args), dict(defaults)).checkpoint_dir
    where, which = checkpoint_location(checkpoint, directory, detect_environment(), "export")
    return ExportRequest(where, which, output, **options)


def read_example(path: str) -> tuple[np.ndarray, ...]:
    """The model's inputs from a NumPy file: .npy one, .npz each of its arrays in the order saved."""
    if not path.endswith((".npy", ".npz")):
        raise ConfigError(f"--example {path!r}: a .npy file (the model's input) or .npz (its inputs, in "
                          "order)")
    try:
        with open(path, "rb") as file:
            loaded = np.load(file, allow_pickle=False)
            arrays = (loaded,) if isinstance(loaded, np.ndarray) else tuple(loaded[n] for n in loaded.files)
    except FileNotFoundError:
        raise ConfigError(f"--example {path!r}: no such file") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--example {path!r} is not a NumPy file ({exc})") from None
    if not arrays:
        raise ConfigError(f"--example {path!r} holds no array")
    return arrays


def _refuse_several_ranks() -> None:
    cluster = detect_cluster()
    if cluster.size > 1:
        raise ConfigError(f"export runs in one process, and this is one of {cluster.size} ranks "
                          f"({cluster.launcher}): run it without a launcher")


def _check_output(output: str, overwrite: bool) -> None:
    if "://" in output:
        raise ConfigError(f"output {output!r}: export writes a local path (copy the file to storage after)")
    path = Path(output)
    if path.exists() and not overwrite:
        raise ConfigError(f"output {output!r} exists: give --overwrite to replace it")
    folder = next((p for p in path.absolute().parents if p.exists()), None)
    if folder is not None and not folder.is_dir():
        raise ConfigError(f"output {output!r}: {str(folder)!r} is a file, not a folder")
    if folder is not None and not os.access(folder, os.W_OK):
        raise ConfigError(f"output {output!r}: the folder {str(folder)!r} cannot be written")


def _format(request: ExportRequest, formats: Sequence[str], framework: str) -> str:
    """The format asked for, else the one the output's name says; an ExportError if this binding does not
    write it."""
    format = request.format
    if format is None:
        format = FORMAT_BY_SUFFIX.get(Path(request.output).suffix)
        if format is None or format not in formats:
            raise ExportError(f"output {request.output!r}: its name does not say a format the {framework} "
                              f"binding writes; give --format: {', '.join(formats)}")
    if format not in formats:
        raise ExportError(f"format {format!r}: the {framework} binding writes {', '.join(formats)}")
    return format


_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainConfig))
