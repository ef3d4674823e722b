"""Model weights from a checkpoint, for inference without the trainer."""

from __future__ import annotations

import torch

from hvdazure.core.checkpoint_store import exported_file
from hvdazure.torch.checkpoint_content import MODEL_FILE


def load_weights(checkpoint: str, which: str = "latest", map_location: str | torch.device = "cpu",
                 ) -> dict[str, torch.Tensor]:
    """The model's state dict from `checkpoint`: a checkpoint directory (path or URL) or a directory of
    checkpoints, whose `which` ("latest", or "best" by the monitor the run was configured with) is taken.
    Checksums are verified; tensors are loaded with `weights_only=True`, from the verified file (memory holds
    the weights once, not also the file's bytes).

        model.load_state_dict(load_weights("outputs/checkpoints", "best"))
    """
    with exported_file(checkpoint, which, MODEL_FILE) as path:
        return torch.load(path, map_location=map_location, weights_only=True)
