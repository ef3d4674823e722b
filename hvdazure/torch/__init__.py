"""PyTorch binding: subclass TorchTrainer, implement the model/data/step hooks, call fit()."""

from hvdazure.torch.export import load_weights
from hvdazure.torch.trainer import TorchTrainer

__all__ = ["TorchTrainer", "load_weights"]
