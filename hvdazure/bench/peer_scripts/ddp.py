"""torchrun + DistributedDataParallel, as PyTorch's DDP tutorial writes it.

    torchrun --standalone --nproc-per-node N ddp.py SPEC.json
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from hvdazure.bench.models_torch import SyntheticData, build_model, sgd
from hvdazure.bench.peers_workload import PeerSpec, StepClock


def main(spec: PeerSpec) -> None:
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    model = DistributedDataParallel(build_model(spec.model).to(device),
                                    device_ids=[device.index] if cuda else None)
    optimizer = sgd(model.parameters())
    data = SyntheticData(spec.model, spec.samples(world_size))
    loader = DataLoader(data, batch_size=spec.batch_size, sampler=DistributedSampler(data, seed=0),
                        pin_memory=cuda)
    clock = StepClock(torch.cuda.synchronize if cuda else None)
    model.train()
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        clock.step_done()
    clock.write(spec, rank, world_size, backend=dist.get_backend())
    dist.destroy_process_group()


if __name__ == "__main__":
    main(PeerSpec.read(sys.argv[1]))
