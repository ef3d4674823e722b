"""Keras 3 model and optimizer state: broadcast from rank 0, and checkpoint files without pickle.

Variables are stored by position in `.npz` files (NumPy arrays only, loaded with allow_pickle=False, so
reading a checkpoint runs no code), with their paths alongside for error messages: positions survive the
name suffixes Keras adds when a process builds several models, and a model of another shape is refused with
the first variable that differs. Keras's random seed generators (Dropout) are per-rank RNG state, not
model weights: they are neither broadcast nor stored with the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdazure.core.backend import FrameworkCheckpointContent
from hvdazure.core.checkpoint.integrity import CheckpointError
from hvdazure.core.checkpoint.weights import exported_file

MODEL_FILE = "model.npz"
OPTIMIZER_FILE = "optimizer.npz"
_PATHS_KEY = "paths"


def model_weights(model: keras.Model) -> list[Any]:
    """The model's weights (trainable and not, as get_weights orders them), without RNG seed states."""
    return list(model.weights)


def seed_generator_states(model: keras.Model) -> list[Any]:
    """The model's variables that are not weights: the states of its Keras seed generators."""
    weights = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def broadcast_variables(variables: Sequence[Any], root_rank: int = 0) -> None:
    """Set every rank's `variables` to root_rank's, in one broadcast per dtype (not one per variable).

    Keras 3 variables are assigned eagerly from plain tensors: Horovod's broadcast_variables fails on them
    ('SymbolicTensor' object has no attribute 'assign')."""
    by_dtype: dict[tf.DType, list[Any]] = {}
    for variable in variables:
        by_dtype.setdefault(tf.as_dtype(variable.dtype), []).append(variable)
    for dtype, group in sorted(by_dtype.items(), key=lambda item: item[0].name):
        flat = tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in group], axis=0)
        received = hvd.broadcast(flat, root_rank, name=f"hvdazure.variables.{dtype.name}")
        sizes = [int(np.prod(v.shape)) for v in group]
        for variable, piece in zip(group, tf.split(received, sizes), strict=True):
            variable.assign(tf.reshape(piece, variable.shape))


def _writer(variables: Sequence[Any], copy: bool) -> Callable[[BinaryIO], None]:
    arrays: dict[str, Any] = {f"{i:05d}": np.array(v.numpy(), copy=True) if copy else np.asarray(v.numpy())
                              for i, v in enumerate(variables)}
    arrays[_PATHS_KEY] = np.array([v.path for v in variables], dtype=np.str_)
    return lambda file: np.savez(file, **arrays)


def load_variables(path: str, variables: Sequence[Any], what: str) -> None:
    """Assign `variables` the arrays of the .npz file at `path` (`what`: its name, in errors), refusing
    another model's (a different count or shape)."""
    with np.load(path, allow_pickle=False) as stored:
        count = len(stored.files) - 1
        saved_paths = [str(p) for p in stored[_PATHS_KEY]]
        if count != len(variables):
            raise ValueError(f"{what} holds {count} variables, this {what.split('.')[0]} has "
                             f"{len(variables)}: the checkpoint is of another model")
        arrays = [stored[f"{i:05d}"] for i in range(count)]
    for variable, array, saved in zip(variables, arrays, saved_paths, strict=True):
        if tuple(variable.shape) != array.shape:
            raise ValueError(f"{what}: variable {saved!r} has shape {array.shape}, this model's "
                             f"{variable.path!r} has {tuple(variable.shape)}: the checkpoint is of another "
                             "model")
    for variable, array in zip(variables, arrays, strict=True):
        variable.assign(array)


class KerasCheckpointContent(FrameworkCheckpointContent):
    """What a checkpoint holds of a Keras model and optimizer, and of this rank's RNG streams."""

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def nonfinite_weight(self) -> str | None:
        weights = [v for v in model_weights(self.model) if tf.as_dtype(v.dtype).is_floating]
        finite = [tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(v))) for v in weights]
        if not weights or bool(tf.reduce_all(tf.stack(finite))):  # one read for all of them
            return None
        return next(str(v.path) for v, ok in zip(weights, finite, strict=True) if not bool(ok))

    def save_files(self, copy: bool) -> dict[str, Callable[[BinaryIO], None]]:
        return {MODEL_FILE: _writer(model_weights(self.model), copy),
                OPTIMIZER_FILE: _writer(self.optimizer.variables, copy)}

    def load_files(self, paths: dict[str, str]) -> None:
        load_variables(paths[MODEL_FILE], model_weights(self.model), MODEL_FILE)
        load_variables(paths[OPTIMIZER_FILE], self.optimizer.variables, OPTIMIZER_FILE)

    def state_dict(self) -> dict[str, Any]:
        return {}  # the loss scale of mixed_float16 is an optimizer variable, in optimizer.npz

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def save_rng(self) -> dict[str, Any]:
        generator = tf.random.get_global_generator()
        return {"tf_global": [int(generator.algorithm), generator.state.numpy().tolist()],
                "seed_generators": [v.numpy().tolist() for v in seed_generator_states(self.model)]}

    def load_rng(self, state: dict[str, Any]) -> None:
        algorithm, values = state["tf_global"]
        tf.random.set_global_generator(tf.random.Generator.from_state(np.array(values, np.int64), algorithm))
        for variable, values in zip(seed_generator_states(self.model), state["seed_generators"], strict=True):
            variable.assign(np.array(values, dtype=variable.dtype))

    def seed(self, seed: int) -> None:
        keras.utils.set_random_seed(seed % 2**32)  # Python, NumPy, TensorFlow and Keras's own generator


def load_weights(checkpoint: str, which: str = "latest") -> list[np.ndarray]:
    """The model's weights from `checkpoint` (a checkpoint directory, or a directory of checkpoints whose
    `which`, "latest" or "best", is taken), verified, in `model.set_weights` order:

        model.set_weights(load_weights("outputs/checkpoints", "best"))
    """
    with exported_file(checkpoint, which, MODEL_FILE) as path:
        try:
            with np.load(path, allow_pickle=False) as stored:
                return [stored[f"{i:05d}"] for i in range(len(stored.files) - 1)]
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{checkpoint}: {MODEL_FILE} is not a model of the TensorFlow binding "
                                  f"({exc})") from None

