"""PyTorch binding: subclass TorchTrainer, implement the model/data/step hooks, call fit()."""

from hvdazure.torch.export import export, load_weights
from hvdazure.torch.model_export import Exported, ExportError
from hvdazure.torch.sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm
from hvdazure.torch.trainer import TorchTrainer

__all__ = ["ExportError", "Exported", "SyncBatchNorm", "TorchTrainer", "convert_sync_batchnorm", "export",
           "load_weights"]
