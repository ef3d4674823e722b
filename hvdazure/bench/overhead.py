"""Trainer overhead: hvdazure's trainers against the hand-written Horovod loop, per step, with an interval.

    hvdazure bench overhead -np 2 [--framework torch|tensorflow|both] [--quick] [--json OUT.json]

For each framework, one job: the same model (an MLP 256-512-512-10), data, batch (64 per rank) and world
size for both variants, TorchTrainer / TensorFlowTrainer against the loop Horovod's examples show
(overhead_torch.py, overhead_tf.py). They run in paired blocks of the same steps (20 pairs of 30-step
blocks; --quick: 2 pairs of 6), after one warm-up pair, the order within a pair alternated, so that the
load of a shared machine hits both alike. A block's time is the slowest rank's, over its steps after the
first (the first makes a new DataLoader iterator or traces the tf.function: per-block setup), data loading
and callbacks included. Reported: the median of the per-pair ratios trainer / hand loop with a seeded
bootstrap 95% interval against the target <= 1.02 (met: the interval lies at or below it; not met: above
it; undecided: it straddles it), and the trainer's own bookkeeping per step, measured in-process: its time
outside run_step (metric reduction, callbacks, the loop; the metric reduction every log_every steps waits
for the slowest rank, so on a loaded machine this includes waiting).
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from hvdazure import Callback
from hvdazure.bench import stats
from hvdazure.bench.runner import main, progress, run_ranks
from hvdazure.figures import pyplot, save_figure

TARGET = 1.02
BATCH_SIZE = 64
FEATURES, HIDDEN, CLASSES = 256, 512, 10
LR, LOG_EVERY = 0.01, 10
HAND, TRAINER = "hand-written", "trainer"
FRAMEWORKS = {"torch": ("torch", "TorchTrainer"), "tensorflow": ("tensorflow", "TensorFlowTrainer")}


class StepClock(Callback):
    """Wall time from one step's end to the next's (data loading, the step and every callback included)."""

    def __init__(self) -> None:
        self.durations: list[float] = []

    def on_epoch_start(self, trainer: Any) -> None:
        self.mark = time.perf_counter()

    def on_step_end(self, trainer: Any) -> None:
        now = time.perf_counter()
        self.durations.append(now - self.mark)
        self.mark = now


class InStepTimer:
    """Mixin for a binding's Trainer (listed before it): the time of each step of its backend's `run_step`,
    the step itself, so that what the trainer does around it can be told apart. Framework-free: both
    benchmarks use it."""

    in_step_s: list[float]

    def _create_backend(self) -> Any:
        backend = super()._create_backend()  # type: ignore[misc]
        run_step = backend.run_step

        def timed(*args: Any) -> float:
            start = time.perf_counter()
            try:
                return run_step(*args)
            finally:
                self.in_step_s.append(time.perf_counter() - start)

        backend.run_step = timed
        return backend


def steady(durations: list[float], in_step_s: list[float] | None = None) -> tuple[float, float | None]:
    """A block's time without its first step (per-block setup), and, given the time of each step inside
    the backend's run_step, the time outside it over the same steps."""
    total = sum(durations[1:])
    return total, None if in_step_s is None else total - sum(in_step_s[1:])


def plan(quick: bool) -> tuple[int, int]:
    """(pairs, steps per block)."""
    return (2, 6) if quick else (20, 30)


def collect(options: dict, timeout_s: float | None = None, verbose: bool = False) -> dict:
    """One job per framework asked for; a framework that is not installed is skipped with the reason."""
    chosen = list(FRAMEWORKS) if options["framework"] == "both" else [options["framework"]]
    results: dict[str, dict] = {}
    for framework in chosen:
        package = FRAMEWORKS[framework][0]
        if importlib.util.find_spec(package) is None:
            results[framework] = {"status": "skipped", "reason": f"{package} is not installed"}
            continue
        results[framework] = {"status": "measured", **run_ranks(
            "overhead", {**options, "framework": framework}, options["np"], options["controller"],
            tag=f" ({framework})", timeout_s=timeout_s, verbose=verbose)}
    return {"frameworks": results}


def measure(options: dict) -> dict | None:
    """On every rank of one framework's job: the warm-up pair, then the timed pairs; rank 0 returns them."""
    if options["framework"] == "tensorflow":
        from hvdazure.bench import overhead_tf as bench
    else:
        from hvdazure.bench import overhead_torch as bench  # type: ignore[no-redef]
    pairs, steps = plan(options["quick"])
    runners = bench.block_runners(steps, BATCH_SIZE)
    seconds: dict[str, list[float]] = {HAND: [], TRAINER: []}
    outside_step: list[float] = []
    started = time.monotonic()
    for pair in range(-1, pairs):  # pair -1: warm-up, not counted
        for variant in (HAND, TRAINER) if pair % 2 == 0 else (TRAINER, HAND):
            block, bookkeeping = runners[variant]()
            block = bench.block_max(block)
            if pair >= 0:
                seconds[variant].append(block)
                if bookkeeping is not None:
                    outside_step.append(bookkeeping / (steps - 1))
        if bench.rank() == 0 and pair >= 0:
            progress(f"{options['framework']}: pair {pair + 1}/{pairs} ({time.monotonic() - started:.0f} s)")
    if bench.rank() != 0:
        return None
    return {"trainer": FRAMEWORKS[options["framework"]][1], "world_size": bench.world_size(),
            "batch_size": BATCH_SIZE, "pairs": pairs, "steps_per_block": steps, "timed_steps_per_block":
            steps - 1, "block_seconds": seconds, "trainer_outside_step_s_per_step": outside_step,
            "summary": summarize(seconds, outside_step, steps - 1)}


def summarize(seconds: dict[str, list[float]], outside_step: list[float], steps: int) -> dict:
    """The per-pair ratios' median and bootstrap interval, the verdict, and the bookkeeping per step."""
    ratios = [t / h for t, h in zip(seconds[TRAINER], seconds[HAND], strict=True)]
    interval = stats.bootstrap_interval(ratios)
    return {
        "ratio_per_pair": ratios,
        "ratio_median": statistics.median(ratios),
        "ratio_ci95": list(interval),
        "target": {"trainer / hand-written <=": TARGET, "verdict": stats.verdict(interval, TARGET)},
        "ms_per_step_median": {v: statistics.median(s) / steps * 1e3 for v, s in seconds.items()},
        "trainer_bookkeeping_us_per_step": stats.summary([s * 1e6 for s in outside_step]),
    }


def table(result: dict) -> str:
    lines = []
    for framework, r in result["frameworks"].items():
        if r["status"] == "skipped":
            lines.append(f"{framework}: skipped: {r['reason']}")
            continue
        s, book = r["summary"], r["summary"]["trainer_bookkeeping_us_per_step"]
        lines.append(f"{r['trainer']} against the hand-written Horovod loop: {r['world_size']} ranks, batch "
                     f"{r['batch_size']}/rank, {r['pairs']} pairs of {r['steps_per_block']}-step blocks")
        for variant, ms in s["ms_per_step_median"].items():
            lines.append(f"  {variant:<14}{ms:>9.3f} ms/step (median over blocks)")
        lines.append(f"  ratio trainer / hand-written: median {s['ratio_median']:.3f}, 95% interval "
                     f"{s['ratio_ci95'][0]:.3f}-{s['ratio_ci95'][1]:.3f} (pairs "
                     f"{min(s['ratio_per_pair']):.3f} to {max(s['ratio_per_pair']):.3f})")
        lines.append(f"  trainer's bookkeeping (outside its step): {book['median']:.0f} us/step median "
                     f"({book['min']:.0f}-{book['max']:.0f} over blocks)")
        lines.append(f"  target <= {TARGET}: {s['target']['verdict']}")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
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


if __name__ == "__main__":
    sys.exit(main("overhead"))
