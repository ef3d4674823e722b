"""Model weights from a checkpoint, for inference without the trainer."""

from __future__ import annotations

import torch

from hvdazure.core.checkpoint import CheckpointError, CheckpointManager


def load_weights(checkpoint: str, which: str = "latest", map_location: str | torch.device = "cpu",
                 ) -> dict[str, torch.Tensor]:
    """The model's state dict from `checkpoint`: a checkpoint directory (path or URL) or a directory of
    checkpoints, whose `which` ("latest", or "best" by the monitor the run was configured with) is taken.
    Checksums are verified; tensors are loaded with `weights_only=True`, from the verified file (memory holds
    the weights once, not also the file's bytes).

        model.load_state_dict(load_weights("outputs/checkpoints", "best"))
    """
    manager = CheckpointManager(checkpoint)
    candidates = manager.checkpoints()
    if not candidates:  # `checkpoint` is itself one checkpoint's directory
        found = manager.open(checkpoint, verify=False)  # local_files verifies model.pt as it reads it
    else:
        config = candidates[-1].manifest.get("config", {})
        if which == "best":
            manager = CheckpointManager(checkpoint, monitor=config.get("monitor"),
                                        mode=config.get("monitor_mode", "min"))
        found = manager.resolve(which)
    if "model.pt" not in found.manifest["files"]:
        raise CheckpointError(f"checkpoint {found.url} holds no model.pt (framework: "
                              f"{found.manifest.get('framework')!r})")
    with manager.local_files(found, names=["model.pt"]) as paths:
        return torch.load(paths["model.pt"], map_location=map_location, weights_only=True)
