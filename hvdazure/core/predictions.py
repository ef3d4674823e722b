"""Exact predictions across ranks: which batches each rank predicts, and the outputs put back together.

The set is cut into batches of `batch_size` in dataset order, the same batches at any world size, and each
rank takes a contiguous run of whole batches (runs differ by at most one batch). So every sample is
predicted once, nothing is padded or repeated, each batch holds the same samples whether 1 rank or 64
predict it (a model whose numbers depend on the batch's make-up gives the same bytes), and joining the
ranks' outputs in rank order gives them in dataset order. Horovod has no gather to one rank: the outputs
travel in one allgather and every rank returns the whole.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from hvdazure.core.metrics import HookReturnError
from hvdazure.core.sample_plan import eval_range

# A batch's predictions as NumPy: one array, or a dict of named arrays, each with one row per sample.
Outputs = np.ndarray | dict[str, np.ndarray]


class PredictionWriter(Protocol):
    """Where predictions bigger than memory go (hvdazure.data.prediction_output.PredictionShards, which a
    binding hands out): every rank writes its part, rank 0 commits them in rank order."""

    def check_empty(self) -> None:
        """Raise ValueError if the destination holds a dataset already (called on rank 0, first)."""

    def write_part(self, rank: int, batches: Iterable[Outputs]) -> bytes:
        """Write this rank's outputs, batch by batch, in order; what `commit` needs of them."""

    def commit(self, parts: list[bytes]) -> None:
        """Make every rank's part (in rank order) one dataset (called on rank 0, last)."""

    def open(self) -> Any:
        """The dataset written, for reading."""


def prediction_batches(num_samples: int, batch_size: int, world_size: int, rank: int) -> list[range]:
    """This rank's batches (sample indices): its contiguous run of the set's batches of `batch_size`."""
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size} is not positive")
    mine = eval_range(-(-num_samples // batch_size), world_size, rank)  # a contiguous piece of the batches
    return [range(b * batch_size, min((b + 1) * batch_size, num_samples)) for b in mine]


def check_rows(hook: str, outputs: Outputs, rows: int) -> Outputs:
    """`outputs` as `hook` returned them for a batch of `rows` samples, or a HookReturnError naming what
    has another number of rows than samples (each sample's prediction is one row)."""
    for name, array in _named(outputs).items():
        what = f"{hook} returned {name}" if name else f"{hook} returned an array"
        if array.ndim == 0 or array.shape[0] != rows:
            shape = "a scalar" if array.ndim == 0 else f"shape {tuple(array.shape)}"
            raise HookReturnError(f"{what} of {shape} for a batch of {rows} samples: return one row per "
                                  "sample (the batch's first dimension)")
    return outputs


def checked_outputs(hook: str, raw: Iterable[Any], batches: list[range],
                    to_numpy: Callable[[Any], np.ndarray]) -> Iterator[Outputs]:
    """What `hook` returned for each of `batches` (in order), as NumPy, each checked to hold a row per
    sample (as_outputs, check_rows)."""
    for value, batch in zip(raw, batches, strict=True):
        yield check_rows(hook, as_outputs(hook, value, to_numpy), len(batch))


def join_batches(hook: str, batches: Iterable[Outputs]) -> Outputs | None:
    """One rank's batch outputs joined along the first dimension; None for a rank without batches. Every
    batch must have the same structure (an array, or a dict of the same names)."""
    batches = list(batches)
    if not batches:
        return None
    first = batches[0]
    if isinstance(first, dict):
        for other in batches[1:]:
            if not isinstance(other, dict) or other.keys() != first.keys():
                raise HookReturnError(f"{hook} returned outputs of another structure for a later batch: "
                                      f"{_structure(first)} then {_structure(other)}")
        return {name: np.concatenate([b[name] for b in batches]) for name in first}
    if any(isinstance(other, dict) for other in batches[1:]):
        raise HookReturnError(f"{hook} returned an array for one batch and a dict for a later one")
    return np.concatenate(batches)  # type: ignore[arg-type]


def gather_in_order(mine: Outputs | None, allgather_bytes: Callable[[bytes], list[bytes]],
                    num_samples: int) -> Outputs:
    """Every rank's joined outputs, in rank order (= dataset order), on every rank; one collective."""
    pieces = [_decode(b) for b in allgather_bytes(_encode(mine))]
    present = [p for p in pieces if p is not None]
    joined = join_batches("predict_step", present)
    assert joined is not None and len(next(iter(_named(joined).values()))) == num_samples
    return joined


def as_outputs(hook: str, value: Any, to_numpy: Callable[[Any], np.ndarray]) -> Outputs:
    """What `hook` returned for a batch (an array/tensor, or a mapping of names to them) as NumPy."""
    if isinstance(value, Mapping):
        if not value:
            raise HookReturnError(f"{hook} returned an empty dict: return the batch's predictions")
        return {str(name): to_numpy(v) for name, v in value.items()}
    if isinstance(value, list | tuple):
        raise HookReturnError(f"{hook} returned a {type(value).__name__}: return one array (tensor) with a "
                              "row per sample, or a dict of them (e.g. {'logits': ..., 'embedding': ...})")
    return to_numpy(value)


def _named(outputs: Outputs) -> dict[str, np.ndarray]:
    return outputs if isinstance(outputs, dict) else {"": outputs}


def _structure(outputs: Outputs) -> str:
    return f"a dict of {sorted(outputs)}" if isinstance(outputs, dict) else "an array"


def _encode(outputs: Outputs | None) -> bytes:
    """One rank's outputs as .npz bytes (arrays only, no pickle); an empty archive for none."""
    buffer = io.BytesIO()
    if outputs is None:
        np.savez(buffer)
    elif isinstance(outputs, dict):
        np.savez(buffer, **{f"d:{name}": array for name, array in outputs.items()})  # type: ignore[arg-type]
    else:
        np.savez(buffer, a=outputs)
    return buffer.getvalue()


def _decode(data: bytes) -> Outputs | None:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        names = list(archive.files)
        if not names:
            return None
        if names == ["a"]:
            array: np.ndarray = archive["a"]
            return array
        return {name[2:]: archive[name] for name in names}
