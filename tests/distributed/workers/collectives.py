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

placement = ("rank", "size", "local_rank", "local_size", "cross_rank", "cross_size")
report_rank(rank, {
    "horovod": {name: getattr(hvd, name)() for name in placement},
    "detected": detected,
    "results": results,
})
