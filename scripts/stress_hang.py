#!/usr/bin/env python
"""Runs the job of tests/distributed/test_sharded_training.py's `torch-2` run (2 ranks under MPI, a
ShardedDataset, num_workers=2, a checkpoint every epoch) N times, each under a timeout, with busy loops on
the cores, and counts the runs that hung. Not part of CI: issue 46 saw this job hang once in 162 runs.

A hung run's stacks (every process of the job: ranks, DataLoader workers, launcher; tests/distributed/
harness.py dumps them when its timeout fires) are written to OUT/hang-<n>.txt; the last line printed is
`runs N, hangs H, failures F`.

    .venv/bin/python scripts/stress_hang.py --runs 50 --busy 2 --timeout 240 --out /tmp/stress
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "distributed")]

from harness import run_job  # noqa: E402
from sharded_data import write_regression_shards  # noqa: E402

SETTINGS = ("lr=0.05", "base_batch_size=8", "extra.framework=torch", "batch_size=4", "num_workers=2")


def busy() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--busy", type=int, default=2, help="busy-loop processes beside the job")
    parser.add_argument("--timeout", type=float, default=240, help="seconds before a run counts as hung")
    parser.add_argument("--controller", default="mpi", choices=("mpi", "gloo"))
    parser.add_argument("--epochs", type=int, default=2,
                        help="epochs per run (the test's 2); each epoch starts the loader workers anew, and "
                             "saves a checkpoint in the background: more epochs, more chances to hang")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="another setting of the job (e.g. --set checkpoint_async=false)")
    parser.add_argument("--out", type=Path, default=Path(tempfile.mkdtemp(prefix="stress-hang-")))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shards = write_regression_shards(args.out / "shards")
    loops = [multiprocessing.Process(target=busy, daemon=True) for _ in range(args.busy)]
    for loop in loops:
        loop.start()
    hangs = failures = 0
    try:
        for n in range(args.runs):
            run = args.out / f"run-{n}"
            (run / "reports").mkdir(parents=True)
            settings = (*SETTINGS, f"epochs={args.epochs}", f"extra.data={shards}",
                        f"checkpoint_dir={run / 'ckpt'}", *args.set)
            started = time.monotonic()
            try:
                job = run_job("sharded_job.py", *[a for s in settings for a in ("--set", s)],
                              out_dir=run / "reports", controller=args.controller, timeout=args.timeout)
            except AssertionError as hung:
                hangs += 1
                (args.out / f"hang-{n}.txt").write_text(str(hung))
                outcome = f"HUNG (stacks in {args.out / f'hang-{n}.txt'})"
            else:
                if job.returncode != 0:
                    failures += 1
                    (args.out / f"failure-{n}.txt").write_text(job.output)
                outcome = f"exit {job.returncode}"
            print(f"run {n}: {outcome} in {time.monotonic() - started:.0f}s", flush=True)
    finally:
        for loop in loops:
            loop.terminate()
    print(f"runs {args.runs}, hangs {hangs}, failures {failures}")
    return 1 if hangs or failures else 0


if __name__ == "__main__":
    sys.exit(main())
