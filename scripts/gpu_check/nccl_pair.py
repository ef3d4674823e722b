"""Whether NCCL lets two ranks share one GPU: both ranks on cuda:0, one allreduce of a CUDA tensor.

    hvdazure run -np 2 scripts/gpu_check/nccl_pair.py

Horovod alone, no hvdazure trainer: hvdazure places rank r on cuda:<local rank>, and this asks only whether
the collective library accepts two ranks on the same device (NCCL refuses that: "Duplicate GPU detected").
Exit 0 and one line "nccl pair: ok" when the sum came back right on both ranks.
"""

from __future__ import annotations

import horovod.torch as hvd
import torch


def main() -> None:
    """Both ranks allreduce [rank + 1] * 4 on cuda:0; each must get 3s."""
    hvd.init()
    torch.cuda.set_device(0)
    got = hvd.allreduce(torch.full((4,), float(hvd.rank() + 1), device="cuda:0"), op=hvd.Sum, name="pair")
    torch.cuda.synchronize()
    if not torch.equal(got.cpu(), torch.full((4,), 3.0)):
        raise SystemExit(f"nccl pair: rank {hvd.rank()} got {got.tolist()}, not [3.0] * 4")
    if hvd.rank() == 0:
        print(f"nccl pair: ok (Horovod NCCL built: {hvd.nccl_built()})", flush=True)


if __name__ == "__main__":
    main()
