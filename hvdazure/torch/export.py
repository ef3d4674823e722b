"""Model weights from a checkpoint, for inference without the trainer."""

from __future__ import annotations

import torch

from hvdazure.core.checkpoint_export import exported_file
from hvdazure.torch.checkpoint_content import MODEL_FILE, load_mapped


def load_weights(checkpoint: str, which: str = "latest", map_location: str | torch.device = "cpu",
                 ) -> dict[str, torch.Tensor]:
    """The model's state dict from `checkpoint`: a checkpoint directory (path or URL) or a directory of
    checkpoints, whose `which` ("latest", or "best" by the monitor the run was configured with) is taken.
    Every file of the checkpoint is verified against its manifest first; the tensors are then loaded with
    `weights_only=True` from the verified file, memory-mapped where the filesystem allows (copy-on-write:
    changing them leaves the file as it is), so that memory holds the weights once and nothing is copied
    twice.

        model.load_state_dict(load_weights("outputs/checkpoints", "best"))
    """
    with exported_file(checkpoint, which, MODEL_FILE) as path:
        return load_mapped(path, map_location)
