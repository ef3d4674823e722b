"""The models the training benchmarks share (throughput, peers), described without a framework: each one's
input, classes and batch per rank; models_torch.py and models_tf.py build them, the same layers in each.

- `mlp`: 512 -> 1024 -> 1024 -> 10 (ReLU), 1.6 M parameters, a few ms a step on one CPU core: the
  latency-bound regime, where the gradient exchange (6.4 MB a step) is as long as the compute.
- `cnn`: conv 3x3 to 32, 64 and 128 channels (max-pool after the first two, global average pool after the
  third), then a linear layer; 0.1 M parameters on 32x32 images, about 70 ms a step on one core at batch 64:
  compute-bound.
- `resnet50`: torchvision's / keras.applications' ResNet-50 on 224x224 images: for GPUs.
"""

from __future__ import annotations

from typing import NamedTuple


class ModelSpec(NamedTuple):
    """One sample's shape (channels first, as PyTorch takes it), the classes and the batch per rank."""

    input_shape: tuple[int, ...]
    classes: int
    batch: int


MODELS = {"mlp": ModelSpec((512,), 10, 64), "cnn": ModelSpec((3, 32, 32), 10, 64),
          "resnet50": ModelSpec((3, 224, 224), 1000, 32)}
MLP_WIDTHS = (1024, 1024)  # the hidden layers
CNN_WIDTH = 32  # the first convolution's channels; the next two have 2x and 4x
DISTINCT_SAMPLES = 64  # synthetic data cycle through this many fixed random samples
LR, MOMENTUM = 0.01, 0.9  # SGD's


def channels_last(shape: tuple[int, ...]) -> tuple[int, ...]:
    """An image shape as Keras takes it (height, width, channels); other shapes unchanged."""
    return (*shape[1:], shape[0]) if len(shape) == 3 else shape
