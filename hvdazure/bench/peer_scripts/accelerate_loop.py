"""HF Accelerate's training loop, as its quick tour writes it, launched with `accelerate launch`: on GPUs
`--multi_gpu`, on CPUs its multi-CPU launcher (mpirun with a hostfile, torch.distributed's Gloo).

    accelerate launch --cpu --num_processes N --num_machines 1 --mpirun_hostfile HOSTS \
        accelerate_loop.py SPEC.json
"""

import sys

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from hvdazure.bench.models_torch import SyntheticData, build_model, sgd
from hvdazure.bench.peers_workload import PeerSpec, StepClock


def main(spec: PeerSpec) -> None:
    cuda = torch.cuda.is_available()
    accelerator = Accelerator(cpu=not cuda)
    model = build_model(spec.model)
    optimizer = sgd(model.parameters())
    data = SyntheticData(spec.model, spec.samples(accelerator.num_processes))
    loader = DataLoader(data, batch_size=spec.batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    clock = StepClock(torch.cuda.synchronize if cuda else None)
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
        optimizer.step()
        clock.step_done()
    clock.write(spec, accelerator.process_index, accelerator.num_processes,
                distributed_type=str(accelerator.distributed_type))
    accelerator.end_training()


if __name__ == "__main__":
    main(PeerSpec.read(sys.argv[1]))
