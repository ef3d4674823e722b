"""What running trials concurrently buys: wall time of 8 fixed trials as one `hvdazure sweep -np 2
--ranks-per-trial 1` against the same 8 trials run one after another as `hvdazure run -np 2 --mpi` jobs
(one launch per trial, each on both ranks: how trials are run without a sweep tool), in the same run.

    .venv/bin/python benchmarks/sweep_vs_sequential.py [--repeats 3] [--epochs 3]
        [--json benchmarks/results/sweep_vs_sequential.json]

The trials are samples/torch_digits.py on a grid of lr x hidden x batch size (8 points). Repeats alternate
which variant runs first; the table gives each repeat's ratio (sequential / sweep) and their median and
range. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_result

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "samples" / "torch_digits.py"
GRID = {"lr": [0.02, 0.05], "extra.hidden": [32, 64], "batch_size": [16, 32]}


def trial_settings() -> list[dict[str, object]]:
    names = list(GRID)
    return [dict(zip(names, values, strict=True)) for values in itertools.product(*GRID.values())]


def run_sweep(workdir: Path, epochs: int) -> float:
    space = workdir / "space.yaml"
    space.write_text("".join(f"{name}: {{type: choice, values: {values}}}\n"
                             for name, values in GRID.items()))
    out = workdir / f"sweep-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "hvdazure.cli", "sweep", "-np", "2", "--ranks-per-trial", "1", str(SCRIPT),
           "--space", str(space), "--sampler", "grid", "--trials", "8", "--metric", "eval_loss", "--output",
           str(out), "--", "--set", f"epochs={epochs}"]
    return timed(cmd)


def run_sequential(epochs: int) -> float:
    start = time.perf_counter()
    for settings in trial_settings():
        sets = [arg for name, value in settings.items() for arg in ("--set", f"{name}={value}")]
        timed([sys.executable, "-m", "hvdazure.cli", "run", "-np", "2", "--mpi", str(SCRIPT), *sets,
               "--set", f"epochs={epochs}", "--set", "progress_bar=false"])
    return time.perf_counter() - start


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=REPO,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--json", type=Path,
                        default=REPO / "benchmarks" / "results" / "sweep_vs_sequential.json")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = ("sweep", "sequential") if repeat % 2 == 0 else ("sequential", "sweep")
            times = {}
            for variant in order:
                times[variant] = run_sweep(Path(tmp), args.epochs) if variant == "sweep" else \
                    run_sequential(args.epochs)
                print(f"repeat {repeat + 1}/{args.repeats}: {variant} {times[variant]:.1f} s", flush=True)
            rows.append({**times, "ratio": times["sequential"] / times["sweep"], "first": order[0]})
    ratios = [r["ratio"] for r in rows]
    print(f"\n8 trials of {SCRIPT.name} ({args.epochs} epochs), 2 ranks, {os.cpu_count()} cores")
    print(f"{'repeat':>6}  {'sweep s':>8}  {'sequential s':>12}  {'sequential / sweep':>18}")
    for i, r in enumerate(rows, 1):
        print(f"{i:>6}  {r['sweep']:>8.1f}  {r['sequential']:>12.1f}  {r['ratio']:>18.2f}")
    print(f"median ratio {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}, "
          f"{len(ratios)} repeats)")
    write_result(args.json, {
        "benchmark": "sweep_vs_sequential", "command": " ".join(sys.argv), "machine": {
            "cpu_count": os.cpu_count(), "platform": platform.platform(), "load_average": os.getloadavg()},
        "trials": trial_settings(), "epochs": args.epochs, "repeats": rows,
        "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
