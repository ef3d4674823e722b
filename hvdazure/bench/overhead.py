"""Trainer overhead: hvdazure's trainers against the hand-written Horovod loop, per step, with an interval.

    hvdazure bench overhead -np 2 [--framework torch|tensorflow|both] [--quick] [--json OUT.json]

For each framework, one job: the same model (an MLP 256-512-512-10), data, batch (64 per rank) and world
size for every variant (overhead_workload.py), TorchTrainer / TensorFlowTrainer against the loop Horovod's
examples show (overhead_torch.py, overhead_tf.py), and against themselves with step_times off (what timing
the step's phases costs, target <= 1.01). They run in matched sets of blocks of the same steps (20 sets of
30-step blocks; --quick: 2 sets of 6), after one warm-up set, the order within a set rotated, so that the
load of a shared machine hits all alike. A block's time is the slowest rank's, over its steps after the
first (the first makes a new DataLoader iterator or traces the tf.function: per-block setup), data loading
and callbacks included. Reported: the median of the per-pair ratios trainer / hand loop with a seeded
bootstrap 95% interval against the target <= 1.02 (met: the interval lies at or below it; not met: above
it; undecided: it straddles it), and the trainer's own bookkeeping per step, measured in-process: its time
outside its backend's run_step (metric reduction, callbacks, the loop; the metric reduction every log_every
steps waits for the slowest rank, so on a loaded machine this includes waiting).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from hvdazure.bench import stats
from hvdazure.bench.benchmark import Jobs, Options, RankBenchmark, Result, progress
from hvdazure.bench.frameworks import FRAMEWORKS, chosen_frameworks, not_installed
from hvdazure.bench.overhead_workload import (
    BATCH_SIZE,
    HAND,
    TRAINER,
    UNTIMED,
    VARIANTS,
    OverheadSide,
    block_schedule,
)
from hvdazure.figures import pyplot, save_figure

TARGET = 1.02
TIMING_TARGET = 1.01  # what timing the step's phases may cost: trainer / the same with step_times off


def framework_side(framework: str) -> OverheadSide:
    """The module that runs the workload on `framework` (imports the framework: on ranks only)."""
    if framework == "tensorflow":
        from hvdazure.bench import overhead_tf

        return overhead_tf
    from hvdazure.bench import overhead_torch

    return overhead_torch


class Overhead(RankBenchmark):
    """One job per framework asked for; on its ranks, paired blocks of the two variants."""

    name = "overhead"

    def run(self, options: Options, jobs: Jobs) -> Result:
        """One job per framework asked for; a framework that is not installed is skipped with the reason."""
        results: dict[str, Result] = {}
        for framework in chosen_frameworks(options["framework"]):
            reason = not_installed(framework)
            if reason is not None:
                results[framework] = {"status": "skipped", "reason": reason}
                continue
            results[framework] = {"status": "measured", **jobs.run_ranks(
                self.name, {**options, "framework": framework}, options["np"], tag=f" ({framework})")}
        return {"frameworks": results}

    def measure(self, options: Options) -> Result | None:
        """On every rank of one framework's job: the warm-up pair, then the timed pairs; rank 0 returns
        them."""
        side = framework_side(options["framework"])
        pairs, steps = block_schedule(options["quick"])
        runners = side.block_runners(steps, BATCH_SIZE)
        seconds: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
        outside_step: list[float] = []
        started = time.monotonic()
        for pair in range(-1, pairs):  # pair -1: warm-up, not counted
            for variant in block_order(pair):
                block, bookkeeping = runners[variant]()
                block = side.slowest_rank(block)
                if pair >= 0:
                    seconds[variant].append(block)
                    if bookkeeping is not None and variant == TRAINER:
                        outside_step.append(bookkeeping / (steps - 1))
            if side.rank() == 0 and pair >= 0:
                progress(f"{options['framework']}: pair {pair + 1}/{pairs} "
                         f"({time.monotonic() - started:.0f} s)")
        if side.rank() != 0:
            return None
        return {"trainer": FRAMEWORKS[options["framework"]].trainer, "world_size": side.world_size(),
                "batch_size": BATCH_SIZE, "pairs": pairs, "steps_per_block": steps, "timed_steps_per_block":
                steps - 1, "block_seconds": seconds, "trainer_outside_step_s_per_step": outside_step,
                "summary": summarize(seconds, outside_step, steps - 1)}

    def table(self, result: Result) -> str:
        lines = []
        for framework, r in result["frameworks"].items():
            if r["status"] == "skipped":
                lines.append(f"{framework}: skipped: {r['reason']}")
                continue
            s, book = r["summary"], r["summary"]["trainer_bookkeeping_us_per_step"]
            lines.append(f"{r['trainer']} against the hand-written Horovod loop: {r['world_size']} ranks, "
                         f"batch {r['batch_size']}/rank, {r['pairs']} pairs of {r['steps_per_block']}-step "
                         "blocks")
            for variant, ms in s["ms_per_step_median"].items():
                lines.append(f"  {variant:<25}{ms:>9.3f} ms/step (median over blocks)")
            lines.append(f"  ratio trainer / hand-written: median {s['ratio_median']:.3f}, 95% interval "
                         f"{s['ratio_ci95'][0]:.3f}-{s['ratio_ci95'][1]:.3f} (pairs "
                         f"{min(s['ratio_per_pair']):.3f} to {max(s['ratio_per_pair']):.3f})")
            lines.append(f"  trainer's bookkeeping (outside its step): {book['median']:.0f} us/step median "
                         f"({book['min']:.0f}-{book['max']:.0f} over blocks)")
            lines.append(f"  target <= {TARGET}: {s['target']['verdict']}")
            t = s["step_times"]
            lines.append(f"  timing the step's phases (trainer / step_times off): median "
                         f"{t['ratio_median']:.3f}, 95% interval "
                         f"{t['ratio_ci95'][0]:.3f}-{t['ratio_ci95'][1]:.3f} (pairs "
                         f"{min(t['ratio_per_pair']):.3f} to {max(t['ratio_per_pair']):.3f}); target <= "
                         f"{TIMING_TARGET}: {t['target']['verdict']}")
        return "\n".join(lines)

    def plot(self, result: Result, path: Path) -> None:
        """Each framework's per-pair ratios in order, with the median, its interval and the target."""
        plt = pyplot()

        fig, ax = plt.subplots(figsize=(7, 4))
        for index, r in enumerate(result["frameworks"].values()):
            if r["status"] != "measured":
                continue
            s, color = r["summary"], f"C{index}"
            ratios = s["ratio_per_pair"]
            ax.plot(range(1, len(ratios) + 1), ratios, "o", color=color, label=f"{r['trainer']} per pair")
            ax.axhline(s["ratio_median"], color=color, label=f"median {s['ratio_median']:.3f}")
            ax.axhspan(*s["ratio_ci95"], color=color, alpha=0.15)
        ax.axhline(TARGET, color="C3", linestyle="--", label=f"target {TARGET}")
        ax.set_xlabel("pair")
        ax.set_ylabel("trainer / hand-written (block time)")
        ax.set_title("trainer overhead (shaded: 95% interval of the median)")
        ax.legend(fontsize="small")
        save_figure(fig, path)


def block_order(pair: int) -> tuple[str, ...]:
    """The variants' order in `pair`: rotated from pair to pair, so that none always runs first."""
    shift = pair % len(VARIANTS)
    return VARIANTS[shift:] + VARIANTS[:shift]


def summarize(seconds: dict[str, list[float]], outside_step: list[float], steps: int) -> dict:
    """The per-pair ratios' median and bootstrap interval and verdict, trainer against the hand-written
    loop and trainer against itself with step_times off; the ms per step; the bookkeeping per step."""
    summary = _paired(seconds[TRAINER], seconds[HAND], "trainer / hand-written <=", TARGET)
    return {
        **summary,
        "step_times": _paired(seconds[TRAINER], seconds[UNTIMED], "trainer / step_times off <=",
                              TIMING_TARGET),
        "ms_per_step_median": {v: statistics.median(s) / steps * 1e3 for v, s in seconds.items()},
        "trainer_bookkeeping_us_per_step": stats.summary([s * 1e6 for s in outside_step]),
    }


def _paired(measured: list[float], baseline: list[float], target_name: str, target: float) -> dict:
    ratios = [m / b for m, b in zip(measured, baseline, strict=True)]
    interval = stats.bootstrap_interval(ratios)
    return {"ratio_per_pair": ratios, "ratio_median": statistics.median(ratios), "ratio_ci95": list(interval),
            "target": {target_name: target, "verdict": stats.verdict(interval, target)}}


if __name__ == "__main__":
    from hvdazure.bench.runner import main

    sys.exit(main("overhead"))
