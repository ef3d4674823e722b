"""The frameworks the overhead and throughput benchmarks measure (`--framework torch|tensorflow|both`),
each through its trainer; one that is not installed is skipped with the reason. Imports no framework."""

from __future__ import annotations

import importlib.util
from typing import NamedTuple


class Framework(NamedTuple):
    """A framework's package (what must be installed) and the trainer measured on it."""

    package: str
    trainer: str


FRAMEWORKS = {"torch": Framework("torch", "TorchTrainer"),
              "tensorflow": Framework("tensorflow", "TensorFlowTrainer")}


def chosen_frameworks(framework: str) -> list[str]:
    """The frameworks `--framework` asks for, in the report's order."""
    return list(FRAMEWORKS) if framework == "both" else [framework]


def not_installed(framework: str) -> str | None:
    """Why `framework` cannot be measured here, or None when its package is installed."""
    package = FRAMEWORKS[framework].package
    return f"{package} is not installed" if importlib.util.find_spec(package) is None else None


def model_unavailable(model: str, framework: str) -> str | None:
    """Why `model` cannot be built on `framework` here (resnet50 needs torchvision or keras.applications),
    or None."""
    if model != "resnet50":
        return None
    if framework == "torch" and importlib.util.find_spec("torchvision") is None:
        return ("--model resnet50 needs torchvision, which is not installed here (pip install torchvision "
                "matching this torch)")
    if framework == "tensorflow" and importlib.util.find_spec("keras") is None:
        return ("--model resnet50 needs keras.applications (Keras 3), which is not installed here "
                "(pip install keras matching this TensorFlow)")
    return None
