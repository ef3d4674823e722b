"""Model weights from a checkpoint, for inference without the trainer, and the model exported from one."""

from __future__ import annotations

from typing import Any

import torch

from hvdazure.core.checkpoint.weights import exported_file
from hvdazure.core.script.model_export import Exported
from hvdazure.torch.checkpoint_content import (
    MODEL_FILE,
    load_mapped,
    load_model_state,
    without_compile_prefix,
)
from hvdazure.torch.model_export import export_model


def load_weights(checkpoint: str, which: str = "latest", map_location: str | torch.device = "cpu",
                 ) -> dict[str, torch.Tensor]:
    """The model's state dict from `checkpoint`: a checkpoint directory (path or URL) or a directory of
    checkpoints, whose `which` ("latest", or "best" by the monitor the run was configured with) is taken.
    Every file of the checkpoint is verified against its manifest first; the tensors are then loaded with
    `weights_only=True` from the verified file, memory-mapped where the filesystem allows (copy-on-write:
    changing them leaves the file as it is), so that memory holds the weights once and nothing is copied
    twice. The keys are the uncompiled model's (a checkpoint written with torch.compile's `_orig_mod.` in
    them has it left out): load them into the model before it is compiled, or into its `_orig_mod`.

        model.load_state_dict(load_weights("outputs/checkpoints", "best"))
    """
    with exported_file(checkpoint, which, MODEL_FILE) as path:
        return without_compile_prefix(load_mapped(path, map_location))


def export(checkpoint: str, path: str, model: torch.nn.Module, example_input: tuple[Any, ...],
           format: str = "onnx", which: str = "latest") -> Exported:
    """`model` (as build_model makes it) with the weights of `checkpoint` (as `load_weights` takes it),
    exported to `path` in `format` ("onnx", "torchscript", "exported_program"), traced on
    `example_input` (a tuple of its positional inputs) and checked against the model on it before it is
    put in place (torch/model_export.py). Without a trainer or Horovod:

        hvdazure.torch.export("outputs/checkpoints", "model.onnx", Net(), (torch.randn(8, 64),), which="best")
    """
    load_model_state(model, load_weights(checkpoint, which))  # compiled or not
    return export_model(model, example_input, path, format)
