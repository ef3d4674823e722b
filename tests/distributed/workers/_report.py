"""Lets a worker script write what it saw as JSON, one file per rank, for the test to assert on, and run
several trainings in one job (`--runs RUNS.json`: tests/distributed/harness.py `run_trainings`)."""

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path


def report_rank(rank: int, data: dict) -> None:
    out = Path(os.environ["HVDAZURE_TEST_OUT"])
    tmp = out / f".rank-{rank}.json.tmp"
    tmp.write_text(json.dumps(data))
    tmp.rename(out / f"rank-{rank}.json")


def step_times(trainer) -> dict | None:
    """What `trainer.step_times` holds after fit(): the last log interval's breakdown."""
    times = trainer.step_times
    return None if times is None else {"shares": times.shares(), "steps": times.steps,
                                       "samples": times.samples, "ranks": times.ranks}


def main(train_and_report: Callable[[list[str] | None], None]) -> None:
    """One training from the command line (`--set ...`), or, given `--runs RUNS.json` (a JSON object of
    name -> list of FIELD=VALUE settings), each training in turn on the same ranks, each reporting into
    HVDAZURE_TEST_OUT/<name>/."""
    if sys.argv[1:2] != ["--runs"]:
        train_and_report(None)
        return
    out = Path(os.environ["HVDAZURE_TEST_OUT"])
    for name, settings in json.loads(Path(sys.argv[2]).read_text()).items():
        os.environ["HVDAZURE_TEST_OUT"] = str(out / name)
        train_and_report([arg for setting in settings for arg in ("--set", setting)])
