"""A trained PyTorch model exported for serving (TorchScript, torch.export's ExportedProgram, ONNX), each
artifact checked against the model before it is put in place.

The artifact is written under a temporary name beside `path`, reloaded (ONNX: run by onnxruntime, what
serving on Azure ML managed endpoints uses), run on the example input, and compared with the model's own
output there; only an artifact that matches is renamed into place: a failed export leaves nothing
behind. The batch dimension of every input stays dynamic (ONNX, ExportedProgram), so the artifact serves
batches of any size.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hvdazure.core.errors import exception_line
from hvdazure.core.script.model_export import (
    Exported,
    ExportError,
    check_outputs,
    put_in_place,
    written_beside,
)
from hvdazure.torch.checkpoint_content import original_module

FORMATS = ("onnx", "torchscript", "exported_program")


def export_model(model: torch.nn.Module, example: tuple[Any, ...], path: str, format: str = "onnx",
                 rtol: float = 1e-4, atol: float = 1e-5) -> Exported:
    """Export `model` (in eval mode, on the CPU) traced on `example` (its positional inputs: tensors or
    NumPy arrays) to `path` in `format`; an ExportError, and nothing written, if its output on `example`
    differs from the model's beyond `rtol`/`atol`. A compiled model (torch.compile) is exported as the model
    it compiled: the exporters trace the Python module, not torch.compile's wrapper."""
    if format not in FORMATS:
        raise ExportError(f"format {format!r}: one of {', '.join(FORMATS)}")
    if not isinstance(example, tuple) or not example:
        raise ExportError("the example input is a tuple of the model's positional inputs, e.g. (x,)")
    model = original_module(model).cpu().eval()
    example = tuple(torch.as_tensor(a).cpu() if isinstance(a, torch.Tensor | np.ndarray) else a
                    for a in example)
    with torch.no_grad():
        expected = _arrays(model(*example))
    target = Path(path)
    with written_beside(target) as partial:
        try:
            with _exporters_quiet():
                got = _WRITERS[format](model, example, partial)(example)
        except ExportError:
            raise
        except Exception as exc:  # the exporter's own refusal (an unsupported operation, a dynamic shape)
            raise ExportError(f"the {format} export failed: {exception_line(exc)[:2000]}") from exc
        worst = check_outputs(format, got, expected, rtol, atol)
        put_in_place(partial, target)
    return Exported(str(target), format, worst)

@contextlib.contextmanager
def _exporters_quiet() -> Iterator[None]:
    """Without the notes torch's exporters print on every export that are no concern of the user's: the
    ONNX registry's 'torchvision is not installed' lines, and torch.export's own FutureWarning about
    its pytree internals. Their errors still surface."""
    registry = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)",
                                    category=FutureWarning)
            yield
    finally:
        registry.setLevel(level)


def _batch_dynamic(example: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple({0: torch.export.Dim.AUTO} if isinstance(a, torch.Tensor) and a.ndim else None
                 for a in example)


Runner = Callable[[tuple[Any, ...]], list[np.ndarray]]


def _torchscript(model: torch.nn.Module, example: tuple[Any, ...], path: str) -> Runner:
    # check_trace off: the artifact's own check below compares it with the model, as for every format
    torch.jit.save(torch.jit.trace(model, example, check_trace=False), path)
    loaded = torch.jit.load(path)
    return lambda inputs: _arrays(_no_grad(loaded, inputs))


def _exported_program(model: torch.nn.Module, example: tuple[Any, ...], path: str) -> Runner:
    program = torch.export.export(model, example, dynamic_shapes=_batch_dynamic(example))
    torch.export.save(program, path)
    loaded = torch.export.load(path).module()
    return lambda inputs: _arrays(_no_grad(loaded, inputs))


def _onnx(model: torch.nn.Module, example: tuple[Any, ...], path: str) -> Runner:
    try:
        import onnxruntime
        import onnxscript  # noqa: F401  (torch.onnx's exporter needs it)
    except ImportError as exc:
        raise ExportError(f"format 'onnx' needs onnx, onnxscript and onnxruntime ({exc}): pip install "
                          "onnx onnxscript onnxruntime") from None
    with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
        program = torch.onnx.export(model, example, dynamo=True, dynamic_shapes=_batch_dynamic(example))
    assert program is not None
    program.save(path, external_data=False)  # one file: a temporary name renamed keeps it whole
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    tensors = lambda inputs: [a.numpy() for a in inputs if isinstance(a, torch.Tensor)]  # noqa: E731
    return lambda inputs: list(session.run(None, dict(zip(names, tensors(inputs), strict=True))))


_WRITERS: dict[str, Callable[[torch.nn.Module, tuple[Any, ...], str], Runner]] = {
    "onnx": _onnx, "torchscript": _torchscript, "exported_program": _exported_program}


def _no_grad(module: Any, inputs: tuple[Any, ...]) -> Any:
    with torch.no_grad():
        return module(*inputs)


def _arrays(output: Any) -> list[np.ndarray]:
    """A model's output (a tensor, or a tuple/list/dict of them) as its tensors in order, as NumPy."""
    leaves, _ = torch.utils._pytree.tree_flatten(output)
    tensors = [leaf.detach().cpu() for leaf in leaves if isinstance(leaf, torch.Tensor)]
    return [(t.float() if t.dtype == torch.bfloat16 else t).numpy() for t in tensors]

