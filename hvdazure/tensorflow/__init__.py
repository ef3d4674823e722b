"""TensorFlow binding: subclass TensorFlowTrainer, implement the model/data/step hooks, call fit()."""

from hvdazure.core.script.model_export import Exported, ExportError
from hvdazure.tensorflow.checkpoint_content import load_weights
from hvdazure.tensorflow.model_export import export
from hvdazure.tensorflow.sync_batchnorm import SyncBatchNormalization
from hvdazure.tensorflow.trainer import TensorFlowTrainer

__all__ = ["ExportError", "Exported", "SyncBatchNormalization", "TensorFlowTrainer", "export", "load_weights"]
