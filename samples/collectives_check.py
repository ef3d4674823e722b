"""A 2-rank smoke test of Horovod collectives with PyTorch and TensorFlow tensors.

    hvdazure run -np 2 samples/collectives_check.py --framework torch
    hvdazure run -np 2 --mpi samples/collectives_check.py --framework tensorflow

Each rank prints what it got from allreduce, broadcast and allgather, then checks it against the exact
expected values and exits non-zero on any mismatch.
"""

from __future__ import annotations

import argparse
import sys


def check_torch() -> list[str]:
    import horovod.torch as hvd
    import torch

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    summed = hvd.allreduce(torch.tensor([rank + 1.0, 10.0 * rank]), op=hvd.Sum, name="sum")
    averaged = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Average, name="avg")
    from_root = hvd.broadcast(torch.tensor([100.0 + rank]), root_rank=0, name="bcast")
    gathered = hvd.allgather(torch.tensor([[float(rank)]] * (rank + 1)), name="gather")  # uneven sizes
    expected = {
        "allreduce(sum)": ([sum(r + 1.0 for r in range(size)), sum(10.0 * r for r in range(size))],
                           summed.tolist()),
        "allreduce(average)": ([sum(range(size)) / size], averaged.tolist()),
        "broadcast(root=0)": ([100.0], from_root.tolist()),
        "allgather": ([float(r) for r in range(size) for _ in range(r + 1)], gathered.flatten().tolist()),
    }
    return _report("torch", rank, size, expected)


def check_tensorflow() -> list[str]:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    summed = hvd.allreduce(tf.constant([rank + 1.0, 10.0 * rank]), op=hvd.Sum, name="sum")
    averaged = hvd.allreduce(tf.constant([float(rank)]), op=hvd.Average, name="avg")
    from_root = hvd.broadcast(tf.constant([100.0 + rank]), root_rank=0, name="bcast")
    gathered = hvd.allgather(tf.constant([[float(rank)]] * (rank + 1)), name="gather")
    expected = {
        "allreduce(sum)": ([sum(r + 1.0 for r in range(size)), sum(10.0 * r for r in range(size))],
                           summed.numpy().tolist()),
        "allreduce(average)": ([sum(range(size)) / size], averaged.numpy().tolist()),
        "broadcast(root=0)": ([100.0], from_root.numpy().tolist()),
        "allgather": ([float(r) for r in range(size) for _ in range(r + 1)],
                      gathered.numpy().flatten().tolist()),
    }
    return _report("tensorflow", rank, size, expected)


def _report(framework: str, rank: int, size: int, expected: dict) -> list[str]:
    errors = []
    for op, (want, got) in expected.items():
        status = "ok" if got == want else f"MISMATCH (expected {want})"
        print(f"{framework} rank {rank}/{size} {op:<18} -> {got} {status}", flush=True)
        if got != want:
            errors.append(f"{framework} {op} on rank {rank}: got {got}, expected {want}")
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("torch", "tensorflow"), required=True)
    args = parser.parse_args()
    errors = check_torch() if args.framework == "torch" else check_tensorflow()
    for error in errors:
        print(error, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
