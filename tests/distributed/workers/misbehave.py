"""A job in which one rank misbehaves while its peers wait in a collective that can never complete.

    misbehave.py exit CODE     rank 1 exits with CODE
    misbehave.py sigkill       rank 1 is killed by SIGKILL
    misbehave.py hang          every rank sleeps forever (for --timeout)
    misbehave.py sigterm       every rank records the SIGTERM it receives, then exits 143
"""

import os
import signal
import sys
import time

import horovod.torch as hvd
import torch
from _report import report_rank

mode = sys.argv[1]
hvd.init()
rank = hvd.rank()
report_rank(rank, {"pid": os.getpid(), "started": True})

if mode == "sigterm":
    def on_sigterm(signum, frame):
        report_rank(rank, {"pid": os.getpid(), "got_sigterm": True})
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_sigterm)
    print(f"rank {rank} ready", flush=True)
    while True:
        time.sleep(0.1)

if mode == "hang":
    print(f"rank {rank} ready", flush=True)
    while True:
        time.sleep(1)

if rank == 1:
    time.sleep(0.5)  # let rank 0 enter the allreduce first
    if mode == "exit":
        sys.exit(int(sys.argv[2]))
    os.kill(os.getpid(), signal.SIGKILL)
hvd.allreduce(torch.ones(1), name="never_completes")
