"""What both bindings' model exports share: the outcome, its error, the check of an artifact's outputs
against the model's, and writing under a temporary name so that only a checked artifact is put in place.
The formats are the bindings' (torch/model_export.py, tensorflow/model_export.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hvdazure.core.errors import UserError


class ExportError(UserError):
    """A model that cannot be exported as asked, or whose export does not compute what it computes."""


@dataclass(frozen=True)
class Exported:
    """What an export wrote: where, in which format, and how far its output was from the model's (the
    largest absolute difference over every output element of the example input)."""

    path: str
    format: str
    max_abs_difference: float

    def describe(self) -> str:
        """One line for a person: what was written, and how close it computes to the model."""
        return (f"exported {self.path} ({self.format}); its outputs on the example input are within "
                f"{self.max_abs_difference:.3g} of the model's")


def check_outputs(format: str, got: Sequence[np.ndarray], expected: Sequence[np.ndarray], rtol: float,
                  atol: float) -> float:
    """The largest absolute difference between an artifact's outputs and the model's; an ExportError if
    their shapes differ or any element is off by more than `rtol`/`atol`."""
    if [g.shape for g in got] != [e.shape for e in expected]:
        raise ExportError(f"the {format} export returns {[g.shape for g in got]}, the model "
                          f"{[e.shape for e in expected]}")
    pairs = [(np.asarray(g, np.float64), np.asarray(e, np.float64))
             for g, e in zip(got, expected, strict=True)]
    worst = max((float(np.max(np.abs(g - e))) for g, e in pairs if e.size), default=0.0)
    if not all(np.allclose(g, e, rtol=rtol, atol=atol) for g, e in pairs):
        raise ExportError(f"the {format} export computes other numbers than the model: largest absolute "
                          f"difference {worst:.3g} on the example input (rtol {rtol}, atol {atol}); nothing "
                          "was written")
    return worst


@contextlib.contextmanager
def written_beside(target: Path) -> Iterator[str]:
    """A temporary path beside `target`, in a hidden directory of its own, for the artifact (a file or a
    directory); `put_in_place` renames it to `target`; what is left is removed when the block ends."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent)
    path = os.path.join(partial, target.name)
    try:
        yield path
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def put_in_place(partial: str, target: Path) -> None:
    """Move a checked artifact (file or directory) to `target`, replacing what was there."""
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    os.replace(partial, target)
