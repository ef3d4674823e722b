"""hvdazure's TensorFlowTrainer on Keras 3, as docs/guides/tensorflow.md writes it (throughput_tf.py's
trainer: build_model, build_optimizer, train_dataset, training_step).

    hvdazure run -np N [--gloo|--mpi] hvdazure_tf.py SPEC.json
"""

import sys

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdazure.bench.peers_workload import PeerSpec, StepClock, fit_hvdazure
from hvdazure.bench.throughput_tf import SyntheticTrainer
from hvdazure.tensorflow.collectives import init_horovod


def main(spec: PeerSpec) -> None:
    on_gpu = init_horovod()  # the world size sizes the data; the trainer's own start finds Horovod running
    clock = StepClock(tf.test.experimental.sync_devices if on_gpu else None)
    fit_hvdazure(SyntheticTrainer, spec, hvd.size(), clock)


if __name__ == "__main__":
    main(PeerSpec.read(sys.argv[1]))
