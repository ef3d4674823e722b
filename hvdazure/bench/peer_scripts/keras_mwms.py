"""tf.distribute.MultiWorkerMirroredStrategy with Keras `fit`, as TensorFlow's multi-worker tutorial writes
it: one process per worker, each told the cluster and its own index in TF_CONFIG (127.0.0.1 here). Keras 2
(tf_keras, as tf.keras under TF_USE_LEGACY_KERAS=1): Keras 3's `fit` fails under this strategy
(keras-team/keras#20585).

    TF_CONFIG='{"cluster": {"worker": [...]}, "task": {"type": "worker", "index": I}}' \
        python keras_mwms.py SPEC.json
"""

import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # before TensorFlow is imported: tf.keras is tf_keras

import tensorflow as tf
from tensorflow import keras

from hvdazure.bench.models_tf import build_model, sgd, synthetic_arrays
from hvdazure.bench.peers_workload import PeerSpec, StepClock, rank_threads


class StepEnds(keras.callbacks.Callback):
    def __init__(self, clock: StepClock) -> None:
        super().__init__()
        self.clock = clock

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.clock.step_done()


def main(spec: PeerSpec) -> None:
    if not tf.config.list_physical_devices("GPU"):  # the same threads per rank as every peer gets
        tf.config.threading.set_intra_op_parallelism_threads(rank_threads())
        tf.config.threading.set_inter_op_parallelism_threads(min(2, rank_threads()))
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model(spec.model, keras)
        model.compile(optimizer=sgd(keras=keras),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = synthetic_arrays(spec.model)
    global_batch = spec.batch_size * strategy.num_replicas_in_sync
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch).prefetch(2)
    clock = StepClock()
    model.fit(data, epochs=1, steps_per_epoch=spec.steps, verbose=0, callbacks=[StepEnds(clock)])
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    clock.write(spec, task["index"], strategy.num_replicas_in_sync)


if __name__ == "__main__":
    main(PeerSpec.read(sys.argv[1]))
