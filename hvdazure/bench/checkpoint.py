"""Checkpoint cost: hvdazure's atomic, verified save and load against bare torch.save / torch.load, the
training stall of async and blocking checkpoints, and what a resume adds to rank 0's peak memory.

    hvdazure bench checkpoint -np 2 [--quick] [--json OUT.json] [--plot OUT.png]

Save and load (rank 0, as saving is; a ~100 MB model + optimizer; --quick: 4 MB): CheckpointManager
(temporary folder, sha256 while writing, fsync, rename, `latest`; loading hashes every file before use)
against one bare torch.save with and without fsync, alternated in each of 5 repeats (--quick: 2); the
per-repeat ratios' median with a bootstrap 95% interval. Target: save <= 1.2 x bare torch.save.
Stall (every rank): rounds of three training blocks, without checkpoints, with async checkpoints and with
blocking ones (checkpoint_async: false), a checkpoint every 10 of 45 steps (--quick: every 3 of 7), their
order rotated; a block is timed from its first step's end to the end of fit(), a pending background write
included. The stall per checkpoint is (block - the round's block without) / checkpoints, per round; its
median with a bootstrap interval. 5 rounds (--quick: 1).
Resume memory (left out by --quick): fresh single-rank processes that build the trainer with and without
a resume, alternated (5 pairs), their peak RSS; the difference is what a resume adds to the peak.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hvdazure.bench import stats
from hvdazure.bench.runner import BenchError, main, progress, run_ranks
from hvdazure.figures import pyplot, save_figure

SAVE_TARGET = 1.2


def plan(quick: bool) -> dict:
    return ({"mb": 4, "repeats": 2, "pairs": 1, "steps": 7, "every": 3} if quick else
            {"mb": 100, "repeats": 5, "pairs": 5, "steps": 45, "every": 10})


def measure(options: dict) -> dict | None:
    from hvdazure.bench.checkpoint_torch import measure_ranks

    return measure_ranks(**plan(options["quick"]), progress=progress)


def _probe(mode: str, mb: int, directory: Path, timeout_s: float | None) -> float:
    """Peak RSS (MB) of a fresh single-rank process (no launcher variables: it must not join a job)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMI", "PMIX_"))}
    proc = subprocess.run([sys.executable, "-m", "hvdazure.bench.checkpoint_torch", mode, str(mb),
                           str(directory)], env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise BenchError(f"checkpoint: the {mode} probe failed (exit code {proc.returncode}; output above)")
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_rss"] / 2**20


def resume_memory(mb: int, pairs: int, timeout_s: float | None) -> dict:
    """Peak RSS of fresh processes that build the trainer, without and with a resume, alternated."""
    with tempfile.TemporaryDirectory(prefix="hvdazure-bench-") as folder:
        _probe("save", mb, Path(folder), timeout_s)
        peaks: dict[str, list[float]] = {"baseline": [], "resume": []}
        for pair in range(pairs):
            for mode in ("baseline", "resume") if pair % 2 == 0 else ("resume", "baseline"):
                peaks[mode].append(_probe(mode, mb, Path(folder), timeout_s))
    added = [r - b for b, r in zip(peaks["baseline"], peaks["resume"], strict=True)]
    return {"status": "measured", "peak_rss_mb": peaks, "added_mb": stats.summary(added)}


def collect(options: dict, timeout_s: float | None = None, verbose: bool = False) -> dict:
    p = plan(options["quick"])
    result = run_ranks("checkpoint", options, options["np"], options["controller"], timeout_s=timeout_s,
                       verbose=verbose)
    if options["quick"]:
        memory = {"status": "skipped", "reason": "--quick leaves out the fresh resume processes"}
    else:
        progress("checkpoint: resume memory")
        memory = resume_memory(p["mb"], p["repeats"], timeout_s)
    return {**p, **result, "resume_memory": memory, "summary": summarize(result, p)}


def _ratio(a: list[float], b: list[float]) -> dict:
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    return {"median": statistics.median(ratios), "ci95": list(stats.bootstrap_interval(ratios))}


def summarize(result: dict, p: dict) -> dict:
    """Save and load ratios per repeat; stall per checkpoint per round, async and blocking."""
    t, blocks = result["save_load_s"], result["block_s"]
    checkpoints = (p["steps"] - 1) // p["every"]  # steps every, 2 every, ... after the first step
    stall = {saving: [(with_saving - none) / checkpoints
                      for with_saving, none in zip(blocks[saving], blocks["none"], strict=True)]
             for saving in ("async", "blocking")}
    save = _ratio(t["hvdazure save"], t["bare save"])
    return {
        "median_s": {name: statistics.median(values) for name, values in t.items()},
        "save_vs_bare": save,
        "save_vs_bare_fsync": _ratio(t["hvdazure save"], t["bare save + fsync"]),
        "load_vs_bare": _ratio(t["hvdazure load"], t["bare load"]),
        "save_target": {"hvdazure save / bare torch.save <=": SAVE_TARGET,
                        "verdict": stats.verdict(tuple(save["ci95"]), SAVE_TARGET)},
        "checkpoints_per_block": checkpoints,
        "stall_s_per_checkpoint": {saving: {"per_round": values, "median": statistics.median(values),
                                            "ci95": list(stats.bootstrap_interval(values))}
                                   for saving, values in stall.items()},
        "step_s_without_checkpoints": statistics.median(blocks["none"]) / (p["steps"] - 1),
    }


def table(result: dict) -> str:
    s = result["summary"]
    lines = [f"checkpoint: a {result['mb']} MB model (+ optimizer), {result['repeats']} alternated repeats"]
    lines += [f"  {name:<20}{value:>9.3f} s (median)" for name, value in s["median_s"].items()]
    for key, text in (("save_vs_bare", "save / bare torch.save"), ("save_vs_bare_fsync",
                      "save / torch.save + fsync"), ("load_vs_bare", "load / torch.load")):
        lines.append(f"  hvdazure {text}: {s[key]['median']:.2f} (95% interval {s[key]['ci95'][0]:.2f}-"
                     f"{s[key]['ci95'][1]:.2f})")
    lines.append(f"  target save <= {SAVE_TARGET} x bare torch.save: {s['save_target']['verdict']}")
    step_ms = s["step_s_without_checkpoints"] * 1e3
    lines.append(f"training on {result['world_size']} ranks, a step {step_ms:.0f} ms without checkpoints,"
                 f" {s['checkpoints_per_block']} checkpoints per block, "
                 f"{result['pairs']} round(s):")
    for saving, st in s["stall_s_per_checkpoint"].items():
        lines.append(f"  stall per {saving} checkpoint: {st['median'] * 1e3:.0f} ms (95% interval "
                     f"{st['ci95'][0] * 1e3:.0f} to {st['ci95'][1] * 1e3:.0f} ms)")
    memory = result["resume_memory"]
    if memory["status"] == "skipped":
        lines.append(f"resume memory: skipped: {memory['reason']}")
    else:
        added = memory["added_mb"]
        lines.append(f"resume adds to rank 0's peak memory: {added['median']:.0f} MB median "
                     f"({added['min']:.0f}-{added['max']:.0f}), over a baseline of "
                     f"{statistics.median(memory['peak_rss_mb']['baseline']):.0f} MB")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Save and load times per variant, and the stall per checkpoint, async against blocking."""
    plt = pyplot()

    s = result["summary"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = list(result["save_load_s"])
    left.boxplot([result["save_load_s"][n] for n in names])
    left.set_xticks(range(1, len(names) + 1), names, rotation=20)
    left.set_ylabel("seconds")
    left.set_title(f"save and load, {result['mb']} MB")
    stall = s["stall_s_per_checkpoint"]
    right.boxplot([[v * 1e3 for v in stall[k]["per_round"]] for k in stall])
    right.set_xticks(range(1, len(stall) + 1), list(stall))
    right.set_ylabel("stall per checkpoint (ms)")
    right.set_title(f"training, {result['world_size']} ranks")
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main("checkpoint"))
