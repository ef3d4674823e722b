"""hvdazure: Horovod data-parallel training for PyTorch and TensorFlow, from a laptop to Azure ML.

Importing this package is cheap on purpose: torch, tensorflow, horovod and azure are imported only by the
modules that need them (hvdazure.torch, hvdazure.tensorflow, hvdazure.azure), so the CLI starts fast.
"""

from hvdazure._version import __version__
from hvdazure.core.callbacks import Callback
from hvdazure.core.cluster import ClusterInfo, detect_cluster
from hvdazure.core.config import ConfigError, TrainConfig

__all__ = ["Callback", "ClusterInfo", "ConfigError", "TrainConfig", "__version__", "detect_cluster"]
