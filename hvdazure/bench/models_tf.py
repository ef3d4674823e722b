"""The benchmarks' models and synthetic data in Keras (models.py describes them; images channels last):
Keras 3 by default, or another Keras API passed in (tf_keras, Keras 2, for MultiWorkerMirroredStrategy,
whose `fit` Keras 3 does not support). Imports Keras only: every peer of `hvdazure bench peers` trains
exactly these, Horovod or not."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from hvdazure.bench.models import CNN_WIDTH, DISTINCT_SAMPLES, LR, MLP_WIDTHS, MODELS, MOMENTUM, channels_last


def synthetic_arrays(model: str, distinct: int = DISTINCT_SAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """A few fixed random samples for `model` (as Horovod's synthetic benchmark, which trains on one random
    batch)."""
    shape, classes, _ = MODELS[model]
    rng = np.random.default_rng(0)
    return (rng.standard_normal((distinct, *channels_last(shape)), dtype=np.float32),
            rng.integers(0, classes, distinct).astype(np.int64))


def build_model(name: str, keras: Any = keras) -> Any:
    """The model called `name` in models.MODELS in the Keras API `keras`, seeded alike everywhere."""
    keras.utils.set_random_seed(0)
    shape, classes, _ = MODELS[name]
    shape, layers = channels_last(shape), keras.layers
    if name == "resnet50":
        resnet = getattr(getattr(keras, "applications", None), "ResNet50", None)
        if resnet is None:
            raise RuntimeError("--model resnet50 needs keras.applications.ResNet50, which this Keras lacks")
        return resnet(weights=None, input_shape=shape, classes=classes)
    if name == "mlp":
        hidden = [layers.Dense(w, activation="relu") for w in MLP_WIDTHS]
        return keras.Sequential([keras.Input(shape), *hidden, layers.Dense(classes)])
    w = CNN_WIDTH
    return keras.Sequential([keras.Input(shape),
                             layers.Conv2D(w, 3, padding="same", activation="relu"), layers.MaxPooling2D(2),
                             layers.Conv2D(2 * w, 3, padding="same", activation="relu"),
                             layers.MaxPooling2D(2),
                             layers.Conv2D(4 * w, 3, padding="same", activation="relu"),
                             layers.GlobalAveragePooling2D(), layers.Dense(classes)])


def sgd(lr: float = LR, keras: Any = keras) -> Any:
    """The benchmarks' optimizer, SGD with momentum, in the Keras API `keras`."""
    return keras.optimizers.SGD(learning_rate=lr, momentum=MOMENTUM)
