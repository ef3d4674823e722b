"""hvdazure's TorchTrainer, as docs/guides/pytorch.md writes it (throughput_torch.py's trainer:
build_model, build_optimizer, train_dataset, training_step).

    hvdazure run -np N [--gloo|--mpi] hvdazure_torch.py SPEC.json
"""

import sys

import horovod.torch as hvd
import torch

from hvdazure import Callback, TrainConfig
from hvdazure.bench.models import LR
from hvdazure.bench.peers_workload import PeerSpec, StepClock
from hvdazure.bench.throughput_torch import SyntheticTrainer


class StepEnds(Callback):
    def __init__(self, clock: StepClock) -> None:
        self.clock = clock

    def on_step_end(self, trainer: object) -> None:
        self.clock.step_done()


def main(spec: PeerSpec) -> None:
    clock = StepClock(torch.cuda.synchronize if torch.cuda.is_available() else None)
    hvd.init()  # the world size sizes the data; the trainer's own start finds Horovod running
    # lr_scaling none: the same SGD step as the other peers' (a speed benchmark; hvdazure scales by default)
    config = TrainConfig(epochs=1, batch_size=spec.batch_size, lr=LR, lr_scaling="none", progress_bar=False)
    trainer = SyntheticTrainer(config, spec.model, spec.samples(hvd.size()), StepEnds(clock))
    trainer.fit()
    clock.write(spec, trainer.rank, trainer.world_size, controller=trainer.collectives.controller)


if __name__ == "__main__":
    main(PeerSpec.read(sys.argv[1]))
