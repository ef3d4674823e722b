"""What a framework binding gives the core, in two small interfaces beside the model-running methods that a
binding's Trainer subclass implements (core/trainer.py):

- `Collectives`: talking to other ranks. The same verbs for every Horovod binding; only the tensor types
  differ. The loop reduces metrics with them, the checkpoint code shares outcomes and RNG states.
- `FrameworkState`: persisting what the framework holds (model and optimizer files, extra JSON state such
  as a loss scaler, RNG streams), as save/load pairs. The checkpoint code is its only user.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO


class Collectives(ABC):
    """Collectives over all ranks of the job; every rank calls each one at the same point."""

    def __init__(self, rank: int, size: int, local_rank: int) -> None:
        self.rank, self.size, self.local_rank = rank, size, local_rank

    @abstractmethod
    def allgather_floats(self, values: Sequence[Any]) -> list[list[float]]:
        """Every rank's `values` (floats or framework scalars; the lengths may differ), as float64, on
        every rank, in rank order; one collective."""

    @abstractmethod
    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's `data` (None elsewhere), on every rank."""

    @abstractmethod
    def allgather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's `data`, in rank order, on every rank."""


def split_rows(joined: Sequence[float]) -> list[list[float]]:
    """The rows of an allgather of rows each sent with its length in front (so rows of any lengths travel
    in one collective), in rank order."""
    rows, at = [], 0
    while at < len(joined):
        length = int(joined[at])
        rows.append([float(v) for v in joined[at + 1 : at + 1 + length]])
        at += 1 + length
    return rows


class FrameworkState(ABC):
    """Model, optimizer and framework state of one rank, saved into and loaded from checkpoints."""

    @abstractmethod
    def save_files(self, copy: bool) -> dict[str, Callable[[BinaryIO], None]]:
        """Writers of the tensor files of a checkpoint (model, optimizer), called on rank 0. With `copy`,
        the state is copied when this is called: training goes on while a background thread writes the
        files. Without, the writers read the live state: the caller trains no further until they are done
        (a blocking save needs no copy, in time or memory)."""

    @abstractmethod
    def load_files(self, paths: dict[str, str]) -> None:
        """Load the tensor files of a checkpoint into model and optimizer, on rank 0. `paths` maps each file
        of the checkpoint (those save_files wrote among them) to a local file already verified against
        the manifest; the files last only for the call. Raise on a state the model cannot take."""

    @abstractmethod
    def save_extra(self) -> dict[str, Any]:
        """JSON-ready framework state beyond model and optimizer (e.g. the AMP loss scaler)."""

    @abstractmethod
    def load_extra(self, state: dict[str, Any]) -> None:
        """Restore what save_extra returned."""

    @abstractmethod
    def save_rng(self) -> dict[str, Any]:
        """This rank's framework RNG states, JSON-ready (Python's and NumPy's are the core's)."""

    @abstractmethod
    def load_rng(self, state: dict[str, Any]) -> None:
        """Restore what save_rng returned, on the same rank."""

    @abstractmethod
    def seed(self, seed: int) -> None:
        """Seed the framework's RNGs on this rank (Python's and NumPy's are the core's)."""
