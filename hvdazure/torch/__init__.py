"""PyTorch binding: subclass TorchTrainer, implement the model/data/step hooks, call fit()."""

from hvdazure.torch.export import load_weights
from hvdazure.torch.sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm
from hvdazure.torch.trainer import TorchTrainer

__all__ = ["SyncBatchNorm", "TorchTrainer", "convert_sync_batchnorm", "load_weights"]
