"""Each rank runs allreduce, broadcast and allgather with one framework and reports what it got, plus
where hvdazure's pre-init cluster detection placed it and where Horovod placed it after init."""

import dataclasses
import sys

from _report import report_rank

from hvdazure.core.environments import detect_cluster

framework = sys.argv[1]
detected = dataclasses.asdict(detect_cluster())  # before hvd.init(), as a trainer's start-up would

if framework == "torch":
    import horovod.torch as hvd
    import torch

    hvd.init()
    rank = hvd.rank()
    results = {
        "sum": hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum, name="sum").tolist(),
        "average": hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Average, name="avg").tolist(),
        "broadcast": hvd.broadcast(torch.tensor([10.0 + rank]), root_rank=0, name="b").tolist(),
        "allgather": hvd.allgather(torch.tensor([float(rank)] * (rank + 1)), name="g").tolist(),
    }
else:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    rank = hvd.rank()
    results = {
        "sum": hvd.allreduce(tf.constant([rank + 1.0]), op=hvd.Sum, name="sum").numpy().tolist(),
        "average": hvd.allreduce(tf.constant([float(rank)]), op=hvd.Average, name="avg").numpy().tolist(),
        "broadcast": hvd.broadcast(tf.constant([10.0 + rank]), root_rank=0, name="b").numpy().tolist(),
        "allgather": hvd.allgather(tf.constant([float(rank)] * (rank + 1)), name="g").numpy().tolist(),
    }


def fake_gpu_per_rank() -> dict:
    """TorchBackend.start where a launcher gave each rank one GPU of its own (CUDA_VISIBLE_DEVICES set per
    rank): FakeCuda, a fake device layer at the torch boundary (tests/unit/fake_cuda.py), shows each rank
    one GPU. No GPU runs: this checks which device the binding picks and the layout rank 0 would log."""
    from pathlib import Path

    import pytest

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit"))
    from fake_cuda import FakeCuda

    from hvdazure.core.config import TrainConfig
    from hvdazure.core.step_times import StepTimes
    from hvdazure.torch.backend import TorchBackend

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CUDA_VISIBLE_DEVICES", str(hvd.local_rank()))
        cuda = FakeCuda(1).install(patch)
        backend = TorchBackend(None, None)  # type: ignore[arg-type]
        try:
            backend.start(None, TrainConfig, StepTimes(enabled=False))  # Horovod runs: init returns
        except RuntimeError as exc:
            return {"error": str(exc)}
        return {"device": str(backend.device), "current": cuda.current, "layout": backend.device_layout}


placement = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")
report_rank(rank, {
    "horovod": {name: getattr(hvd, name)() for name in placement},
    "detected": detected,
    "results": results,
    **({"fake_gpu_per_rank": fake_gpu_per_rank()} if framework == "torch" else {}),
})
