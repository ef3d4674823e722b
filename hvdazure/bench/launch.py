"""What `hvdazure run` costs over the bare launchers: wall time of an N-rank job that does one allreduce,
started through `hvdazure run` and through `horovodrun` / `mpirun` directly.

    hvdazure bench launch -np 2 [--gloo|--mpi] [--quick] [--json OUT.json]

For the controller chosen (MPI: mpirun, the default where it can run; Gloo: horovodrun), the two variants
alternate, 5 repeats (--quick: 1), so machine noise hits them alike. Reported: the median wall time of
each, the median of the per-repeat differences and ratios (hvdazure run / bare) with a bootstrap 95%
interval. The difference is the rank wrapper (one more Python process per rank, output re-emitted line by
line) and the supervisor: paid once per job, not per step. A bare launcher that is not installed is a
one-line error.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hvdazure.bench import stats
from hvdazure.bench.benchmark import BenchError, Benchmark, Jobs, Options, Result, progress
from hvdazure.bench.processes import Command, run_together
from hvdazure.figures import pyplot, save_figure

BARE, OURS = {"gloo": "horovodrun", "mpi": "mpirun"}, "hvdazure run"
JOB = """
import horovod.torch as hvd, torch
hvd.init()
hvd.allreduce(torch.ones(1), name="x")
"""


def commands(script: str, num_proc: int, controller: str) -> tuple[dict[str, list[str]], str | None]:
    """The bare launcher's command and hvdazure run's, or None and why the bare launcher is missing."""
    py, n = sys.executable, str(num_proc)
    ours = [py, "-m", "hvdazure.cli", "run", "-np", n, f"--{controller}", script]
    if controller == "gloo":
        horovodrun = Path(py).parent / "horovodrun"
        if not horovodrun.is_file():
            return {}, f"horovodrun not found beside {py}"
        bare = [str(horovodrun), "--gloo", "-np", n, "-H", f"localhost:{n}", py, script]
    else:
        mpirun = shutil.which("mpirun")
        if mpirun is None:
            return {}, "mpirun not found on PATH"
        bare = [mpirun, "--allow-run-as-root", "-np", n, "-bind-to", "none", "-map-by", "slot",
                "-H", f"localhost:{n}", py, script]
    return {BARE[controller]: bare, OURS: ours}, None


def time_job(cmd: list[str], timeout_s: float | None, log: Path) -> float:
    """The wall time of one job, start to exit, its output in `log`; a failed job is a BenchError with the
    last line it printed."""
    command = Command(cmd, {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, log)
    start = time.perf_counter()
    code, = run_together([command], timeout_s, "launch")
    wall = time.perf_counter() - start
    if code != 0:
        raise BenchError(f"launch: {command.describe()} failed (exit code {code}): "
                         f"{(command.last_lines(1) or [''])[-1]}")
    return wall


def summarize(ours: list[float], bare: list[float]) -> dict:
    """Medians, and the per-repeat differences and ratios hvdazure run / bare with bootstrap intervals."""
    differences = [o - b for o, b in zip(ours, bare, strict=True)]
    ratios = [o / b for o, b in zip(ours, bare, strict=True)]
    return {"bare_median_s": statistics.median(bare), "hvdazure_median_s": statistics.median(ours),
            "overhead_s_median": statistics.median(differences),
            "overhead_s_ci95": list(stats.bootstrap_interval(differences)),
            "ratio_median": statistics.median(ratios), "ratio_ci95": list(stats.bootstrap_interval(ratios))}


class Launch(Benchmark):
    """Starts its own jobs: the bare launcher's and `hvdazure run`'s, each timed from here (no ranks of its
    own to measure on)."""

    name = "launch"

    def run(self, options: Options, jobs: Jobs) -> Result:
        """Both variants once per repeat, alternated; then the comparison."""
        repeats, controller = (1 if options["quick"] else 5), options["controller"]
        with tempfile.TemporaryDirectory(prefix="hvdazure-bench-") as folder:
            script = str(Path(folder) / "one_allreduce.py")
            Path(script).write_text(JOB)
            cmds, missing = commands(script, options["np"], controller)
            if missing:
                raise BenchError(f"launch: {missing}")
            times: dict[str, list[float]] = {name: [] for name in cmds}
            for repeat in range(repeats):
                for name, cmd in cmds.items():
                    times[name].append(time_job(cmd, jobs.timeout_s, Path(folder) / "job.log"))
                progress(f"launch: repeat {repeat + 1}/{repeats}")
        return {"world_size": options["np"], "launcher": BARE[controller], "repeats": repeats,
                "times_s": times, "summary": summarize(times[OURS], times[BARE[controller]])}

    def table(self, result: Result) -> str:
        s = result["summary"]
        low, high = s["overhead_s_ci95"]
        return "\n".join([
            f"launch: a {result['world_size']}-rank job doing one allreduce, {result['repeats']} alternated "
            f"repeat(s)",
            f"{'bare ' + result['launcher'] + ' (s)':>20}{'hvdazure run (s)':>18}{'overhead (s)':>14}"
            "  95% interval",
            f"{s['bare_median_s']:>20.2f}{s['hvdazure_median_s']:>18.2f}{s['overhead_s_median']:>14.2f}  "
            f"{low:.2f} to {high:.2f}"])

    def plot(self, result: Result, path: Path) -> None:
        """Every repeat's wall time per variant."""
        plt = pyplot()

        fig, ax = plt.subplots(figsize=(7, 4))
        names = list(result["times_s"])
        ax.boxplot([result["times_s"][n] for n in names])
        ax.set_xticks(range(1, len(names) + 1), names, rotation=15)
        ax.set_ylabel("job wall time (s)")
        ax.set_title(f"launch: {result['world_size']} ranks, one allreduce, {result['launcher']}")
        save_figure(fig, path)


if __name__ == "__main__":
    from hvdazure.bench.runner import main

    sys.exit(main("launch"))
