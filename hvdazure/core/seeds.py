"""Every seed a rank's RNGs get, in one place, and this rank's RNG streams as one stateful piece.

Policy. Model weights start from `config.seed` on every rank (the bindings seed the framework with it
before build_model; rank 0's weights are broadcast anyway). After the build each rank's streams (Python,
NumPy, the framework's: dropout, augmentation) are seeded differently, from the seed and the rank, so that
ranks do not draw the same noise. A checkpoint keeps every rank's streams; a resume at the same world size
restores them, and a resume at another one, where no saved stream belongs to a rank, seeds afresh from the
seed, the rank and the step: reproducible, and different from the streams of the first run.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from hvdazure.core.backend import FrameworkCheckpointContent


def rank_seed(seed: int, rank: int) -> int:
    """The seed of `rank`'s RNG streams at the start of training."""
    return seed * 1_000_003 + rank


def resume_seed(seed: int, rank: int, step: int) -> int:
    """The seed of `rank`'s streams after a resume at another world size, at optimizer step `step`."""
    return seed * 1_000_003 + rank * 7919 + step


def python_rng_state() -> dict[str, Any]:
    """Python's and NumPy's global RNG states as JSON."""
    version, internal, gauss = random.getstate()
    legacy: tuple[str, Any, int, int, float] = np.random.get_state(legacy=True)  # type: ignore[assignment]
    kind, keys, pos, has_gauss, cached = legacy
    return {"python": [version, list(internal), gauss],
            "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]}


def set_python_rng_state(state: dict[str, Any]) -> None:
    """Restore what python_rng_state returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


class RankRandomState:
    """This rank's RNG streams: Python's and NumPy's (the core's) and the framework's, saved, restored and
    seeded together. A checkpoint gathers every rank's state_dict into rng.json."""

    def __init__(self, framework: FrameworkCheckpointContent) -> None:
        self.framework = framework

    def seed(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        self.framework.seed(seed)

    def state_dict(self) -> dict[str, Any]:
        return {**python_rng_state(), "framework": self.framework.save_rng()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_python_rng_state(state)
        self.framework.load_rng(state["framework"])
