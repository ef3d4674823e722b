"""What each rank of a benchmark job runs: `python -m hvdazure.bench.rank NAME OPTIONS.json OUT.json`.

Calls the benchmark's `measure(options)` on every rank; rank 0's result (the others return None) is written
to OUT.json for the launching process (jobs.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hvdazure.bench.registry import load_rank_benchmark


def main(argv: list[str]) -> int:
    name, options_path, out_path = argv
    result = load_rank_benchmark(name).measure(json.loads(Path(options_path).read_text()))
    if result is not None:
        Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
