"""What `hvdazure run` costs over the bare launchers: wall time of a 2-rank job that only does one
allreduce, started through `hvdazure run` and through `horovodrun` / `mpirun` directly, in the same run.

    .venv/bin/python benchmarks/launch_overhead.py [--repeats 5] [--json benchmarks/results/launch.json]

Prints a table and writes JSON. The overhead is the rank wrapper (one extra Python process per rank,
output re-emitted line by line) and the supervisor; it is paid once per job, not per step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_result

JOB = """
import horovod.torch as hvd, torch
hvd.init()
hvd.allreduce(torch.ones(1), name="x")
"""


def commands(script: str, bin_dir: Path) -> dict[str, list[str]]:
    py = sys.executable
    hvdazure = [py, "-m", "hvdazure.cli", "run", "-np", "2"]
    return {
        "gloo: horovodrun": [str(bin_dir / "horovodrun"), "--gloo", "-np", "2", "-H", "localhost:2", py,
                             script],
        "gloo: hvdazure run": [*hvdazure, "--gloo", script],
        "mpi: mpirun": ["mpirun", "--allow-run-as-root", "-np", "2", "-bind-to", "none", "-map-by", "slot",
                        "-H", "localhost:2", py, script],
        "mpi: hvdazure run": [*hvdazure, "--mpi", script],
    }


def time_job(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    default_json = Path(__file__).parent / "results" / "launch_overhead.json"
    parser.add_argument("--json", type=Path, default=default_json)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        script = str(Path(tmp) / "one_allreduce.py")
        Path(script).write_text(JOB)
        cmds = commands(script, Path(sys.executable).parent)
        times: dict[str, list[float]] = {name: [] for name in cmds}
        for _ in range(args.repeats):  # interleaved, so machine noise hits every variant alike
            for name, cmd in cmds.items():
                times[name].append(time_job(cmd))

    rows = []
    for controller, bare in (("gloo", "gloo: horovodrun"), ("mpi", "mpi: mpirun")):
        ours = f"{controller}: hvdazure run"
        bare_s, ours_s = statistics.median(times[bare]), statistics.median(times[ours])
        rows.append({"controller": controller, "bare_median_s": round(bare_s, 3),
                     "hvdazure_median_s": round(ours_s, 3), "overhead_s": round(ours_s - bare_s, 3),
                     "ratio": round(ours_s / bare_s, 3), "repeats": args.repeats})

    print(f"{'controller':<11}{'bare (s)':>10}{'hvdazure (s)':>14}{'overhead (s)':>14}{'ratio':>8}")
    for row in rows:
        print(f"{row['controller']:<11}{row['bare_median_s']:>10.2f}{row['hvdazure_median_s']:>14.2f}"
              f"{row['overhead_s']:>14.2f}{row['ratio']:>8.2f}")
    write_result(args.json, {"benchmark": "launch_overhead", "rows": rows, "raw_s": times})
    return 0


if __name__ == "__main__":
    sys.exit(main())
