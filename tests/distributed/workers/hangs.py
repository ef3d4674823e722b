"""A job that hangs on purpose, for the stacks a hung job's timeout dumps (test_hang_diagnosis.py).

Rank 0 forks a child, as a DataLoader worker is forked, and waits for it in `rank_0_waits_for_its_worker`;
the child sleeps in `worker_sleeps_forever`; rank 1 waits forever on a lock it holds, in
`rank_1_waits_on_a_lock`. Each reports its pid (rank 0: `worker`, its child's) right before it blocks.
It imports hvdazure (every process registers its faulthandler, launch/stack_dumps.py) but neither torch nor
Horovod, so its ranks reach their hangs within a short --timeout.
"""

import multiprocessing
import os
import threading
import time

from _report import report_rank

import hvdazure  # noqa: F401  (what registers each process's faulthandler under hvdazure run)


def worker_sleeps_forever() -> None:
    while True:
        time.sleep(1)


def rank_0_waits_for_its_worker() -> None:
    worker = multiprocessing.get_context("fork").Process(target=worker_sleeps_forever)
    worker.start()
    report_rank(0, {"pid": os.getpid(), "worker": worker.pid})
    worker.join()


def rank_1_waits_on_a_lock() -> None:
    lock = threading.Lock()
    lock.acquire()
    report_rank(1, {"pid": os.getpid()})
    lock.acquire()


if __name__ == "__main__":
    rank = int(os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    rank_0_waits_for_its_worker() if rank == 0 else rank_1_waits_on_a_lock()
