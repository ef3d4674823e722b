"""TensorFlow binding: subclass TensorFlowTrainer, implement the model/data/step hooks, call fit()."""

from hvdazure.tensorflow.checkpoint_content import load_weights
from hvdazure.tensorflow.sync_batchnorm import SyncBatchNormalization
from hvdazure.tensorflow.trainer import TensorFlowTrainer

__all__ = ["SyncBatchNormalization", "TensorFlowTrainer", "load_weights"]
