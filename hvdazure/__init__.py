"""hvdazure: Horovod data-parallel training for PyTorch and TensorFlow, from a laptop to Azure ML.

Importing this package is cheap on purpose: torch, tensorflow, horovod and azure are imported only by the
modules that need them (hvdazure.torch, hvdazure.tensorflow, hvdazure.azure), so the CLI starts fast.

A mistake in what the script gives hvdazure (core/errors.py UserError: a config field, a checkpoint, the
data, a hook's return) ends the script as one line from the moment this package is imported, not only
inside `fit()`: `TrainConfig(epoch=3)` at the top of a script says what `--set epoch=3` says.

Under `hvdazure run`, every process that imports it can have its stacks dumped, for a job that hangs
(launch/stack_dumps.py).
"""

from hvdazure._version import __version__
from hvdazure.core.callbacks import Callback
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.environments import ClusterInfo, detect_cluster
from hvdazure.core.errors import show_user_errors_in_one_line
from hvdazure.launch.stack_dumps import register_from_environment

show_user_errors_in_one_line()
register_from_environment()

__all__ = ["Callback", "ClusterInfo", "ConfigError", "TrainConfig", "__version__", "detect_cluster"]
