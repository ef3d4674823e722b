"""hvdazure's TorchTrainer, as docs/guides/pytorch.md writes it (throughput_torch.py's trainer:
build_model, build_optimizer, train_dataset, training_step).

    hvdazure run -np N [--gloo|--mpi] hvdazure_torch.py SPEC.json
"""

import sys

import horovod.torch as hvd
import torch

from hvdazure.bench.peers_workload import PeerSpec, StepClock, fit_hvdazure
from hvdazure.bench.throughput_torch import SyntheticTrainer


def main(spec: PeerSpec) -> None:
    clock = StepClock(torch.cuda.synchronize if torch.cuda.is_available() else None)
    hvd.init()  # the world size sizes the data; the trainer's own start finds Horovod running
    fit_hvdazure(SyntheticTrainer, spec, hvd.size(), clock)


if __name__ == "__main__":
    main(PeerSpec.read(sys.argv[1]))
