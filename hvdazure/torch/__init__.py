"""PyTorch binding: subclass TorchTrainer, implement the model/data/step hooks, call fit()."""

from hvdazure.torch.trainer import TorchTrainer

__all__ = ["TorchTrainer"]
