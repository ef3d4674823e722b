"""Lets a worker script write what it saw as JSON, one file per rank, for the test to assert on."""

import json
import os
from pathlib import Path


def report_rank(rank: int, data: dict) -> None:
    out = Path(os.environ["HVDAZURE_TEST_OUT"])
    tmp = out / f".rank-{rank}.json.tmp"
    tmp.write_text(json.dumps(data))
    tmp.rename(out / f"rank-{rank}.json")
