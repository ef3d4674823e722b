"""The checkpoint benchmark's workload, shared by the launching process (checkpoint.py) and the PyTorch side
(checkpoint_torch.py): the model's size and how often each part is repeated, the batch, and the memory
probes' modes. Imports no framework.
"""

from __future__ import annotations

from typing import Any

BATCH_SIZE = 32  # per rank, in the training blocks
PROBES = ("baseline", "async save", "blocking save", "resume")  # the memory probes, one process each


def schedule(quick: bool) -> dict[str, Any]:
    """The model's size ("mb"), the save/load repeats, the training rounds ("pairs": each three blocks) of
    "steps" steps with a checkpoint "every" so many, and the memory probes' rounds."""
    return ({"mb": 4, "repeats": 2, "pairs": 1, "memory_rounds": 1, "steps": 7, "every": 3} if quick else
            {"mb": 100, "repeats": 21, "pairs": 8, "memory_rounds": 3, "steps": 45, "every": 10})
