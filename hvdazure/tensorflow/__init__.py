"""TensorFlow binding: subclass TensorFlowTrainer, implement the model/data/step hooks, call fit()."""

from hvdazure.tensorflow.checkpoint_content import load_weights
from hvdazure.tensorflow.trainer import TensorFlowTrainer

__all__ = ["TensorFlowTrainer", "load_weights"]
