"""A trained Keras 3 model exported for serving: a `.keras` file (Keras's own format, for Keras and
Azure ML's MLflow/scoring scripts) or a TensorFlow SavedModel directory (`model.export`, for TF Serving
and TFLite converters), each reloaded and checked against the model before it is put in place
(core/script/model_export.py). The example input is made from the model's input specs when none is given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from hvdazure.core.script.model_export import (
    Exported,
    ExportError,
    check_outputs,
    put_in_place,
    written_beside,
)
from hvdazure.tensorflow.checkpoint_content import load_weights

FORMATS = ("keras", "saved_model")


def export_model(model: keras.Model, path: str, format: str = "keras", example_input: Any = None,
                 rtol: float = 1e-5, atol: float = 1e-6) -> Exported:
    """Write `model` to `path` as `format`; an ExportError, and nothing written, if the reloaded artifact's
    output on `example_input` (the model's input; a tuple of its inputs is taken as one input or a list;
    default: a batch of 4 drawn from the model's input specs) differs from the model's beyond
    `rtol`/`atol`."""
    if format not in FORMATS:
        raise ExportError(f"format {format!r}: one of {', '.join(FORMATS)}")
    if format == "keras" and not path.endswith(".keras"):
        raise ExportError(f"{path!r}: a Keras file's name ends with .keras")
    example = example_input if example_input is not None else _example(model)
    if isinstance(example, tuple):  # the model's inputs in order (an --example file's): one, or a list
        example = example[0] if len(example) == 1 else list(example)
    expected = _arrays(model(example, training=False))
    target = Path(path)
    with written_beside(target) as partial:
        if format == "keras":
            model.save(partial)
            reloaded = _reloaded(lambda: keras.models.load_model(partial), format)
            got = _arrays(reloaded(example, training=False))
        else:
            model.export(partial, format="tf_saved_model", verbose=False)
            # held in a name: serve reads its variables
            reloaded = _reloaded(lambda: tf.saved_model.load(partial), format)
            got = _arrays(reloaded.serve(example))
        worst = check_outputs(format, got, expected, rtol, atol)
        put_in_place(partial, target)
    return Exported(str(target), format, worst)


def export(checkpoint: str, path: str, model: keras.Model, format: str = "keras", which: str = "latest",
           example_input: Any = None) -> Exported:
    """`model` (as build_model makes it) with the weights of `checkpoint` (as `load_weights` takes it),
    exported to `path` as "keras" (.keras) or "saved_model", checked against the model before it is put in
    place. Without a trainer or Horovod:

        hvdazure.tensorflow.export("outputs/checkpoints", "model.keras", build_model(), which="best")
    """
    model.set_weights(load_weights(checkpoint, which))
    return export_model(model, path, format, example_input)


def _reloaded(load: Any, format: str) -> Any:
    try:
        return load()
    except (TypeError, ValueError) as exc:  # e.g. a custom layer Keras cannot rebuild from its config
        first = str(exc).strip().splitlines()[0]
        raise ExportError(f"the {format} export does not load back ({first}): register custom layers with "
                          "@keras.saving.register_keras_serializable()") from None


def _example(model: keras.Model) -> Any:
    """A batch of 4 for each of the model's inputs, in their structure, shapes and dtypes."""
    rng = np.random.default_rng(0)

    def batch(spec: Any) -> np.ndarray:
        shape = [4 if d is None else d for d in spec.shape]
        dtype = np.dtype(spec.dtype)
        values = rng.normal(size=shape) if dtype.kind == "f" else np.zeros(shape)
        return values.astype(dtype)

    inputs = model.inputs
    if not inputs:
        raise ExportError("the model has no input specs (give it a keras.Input): pass example_input")
    return batch(inputs[0]) if len(inputs) == 1 else [batch(spec) for spec in inputs]


def _arrays(output: Any) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in tf.nest.flatten(output)]
