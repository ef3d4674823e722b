"""A job in which one rank misbehaves while its peers wait in a collective that can never complete.

    misbehave.py exit CODE     rank 1 exits with CODE
    misbehave.py slow-exit CODE  rank 1 exits with CODE but takes 3 s to do so after Horovod shut down
                               (a large model being freed, data loader workers joining): its peer sees
                               the shutdown and fails first
    misbehave.py sigkill       rank 1 is killed by SIGKILL
    misbehave.py raise         rank 1 raises a ValueError (its peer then fails with Horovod's shutdown error)
    misbehave.py hang          every rank sleeps forever (for --timeout); it starts without importing
                               torch or Horovod, so a short --timeout finds every rank started
    misbehave.py sigterm       every rank records the SIGTERM it receives, then exits 143
"""

import atexit
import os
import signal
import sys
import time

from _report import report_rank

mode = sys.argv[1]
if mode == "hang":
    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    report_rank(rank, {"pid": os.getpid(), "started": True})
    print(f"rank {rank} ready", flush=True)
    while True:
        time.sleep(1)

import horovod.torch as hvd  # noqa: E402  (after the hang mode, which needs neither)
import torch  # noqa: E402

seen = {}
# Registered before hvd.init(), so it runs after Horovod's own exit handler has shut Horovod down.
atexit.register(lambda: mode == "slow-exit" and seen.get("rank") == 1 and time.sleep(3))
hvd.init()
rank = seen["rank"] = hvd.rank()

if mode == "sigterm":
    def on_sigterm(signum, frame):
        report_rank(rank, {"pid": os.getpid(), "got_sigterm": True})
        sys.exit(143)
    # Before the "started" report the test waits for: a SIGTERM sent right after it must find the handler.
    signal.signal(signal.SIGTERM, on_sigterm)
report_rank(rank, {"pid": os.getpid(), "started": True})

if mode == "sigterm":
    print(f"rank {rank} ready", flush=True)
    while True:
        time.sleep(0.1)


def check_shard(rank: int) -> None:
    raise ValueError(f"rank {rank} dislikes its shard")


if rank == 1:
    time.sleep(0.5)  # let rank 0 enter the allreduce first
    if mode in ("exit", "slow-exit"):
        sys.exit(int(sys.argv[2]))
    if mode == "raise":
        check_shard(rank)
    os.kill(os.getpid(), signal.SIGKILL)
hvd.allreduce(torch.ones(1), name="never_completes")
