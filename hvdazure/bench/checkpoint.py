"""Checkpoint cost: hvdazure's atomic, verified save and load against bare torch.save / torch.load, the
training stall of async and blocking checkpoints, and rank 0's peak memory during a save and a resume.

    hvdazure bench checkpoint -np 2 [--quick] [--json OUT.json] [--plot OUT.png]
    hvdazure bench checkpoint --url abfs://CONTAINER/PATH [--quick] [--json OUT.json]

Save and load (rank 0, as saving is; a ~100 MB model + optimizer; --quick: 4 MB): a blocking checkpoint's
save of model and optimizer (temporary folder, hashed while written, fsync, rename, `latest`) against
torch.save of the same state + fsync, and write + fsync of as many bytes (the disk's floor, measured in the
same run); a resume's load (the newest valid checkpoint, every byte verified, loaded into model and
optimizer) against torch.load of the hand-saved file into them. The variants' order is rotated over 21
repeats (--quick: 2) after a warm-up round, so that each follows every other as often: on a VM whose freed
memory is slow to touch again for a while (this one), whatever follows a load pays for it. Ratios per
repeat: their median with a bootstrap 95% interval, against the targets save <= 1.1 x torch.save + fsync,
load <= 1.3 x torch.load.
Stall (every rank): rounds of three training blocks, without checkpoints, with async checkpoints and with
blocking ones (checkpoint_async: false), a checkpoint every 10 of 45 steps (--quick: every 3 of 7), their
order rotated. Each step after the first is timed (the slowest rank's), up to the last: the last periodic
checkpoint's background write ends within the block, and the final checkpoint fit() writes after it
(blocking in every mode) is left out. A block's stall is the sum of its steps' excess over its own median
step (checkpoints touch a few steps of every ten, so the median is an unaffected step's, and drift between
blocks, large on a shared VM, cancels), per checkpoint; the block without checkpoints gives the method's
noise. The async stall over the blocking one, per round, against the target <= 0.10. 8 rounds (--quick:
1). Run it with -np 1 and -np 2: the stall depends on what the ranks share.
On a store (--url): rank 0's save and load to and from that URL (a folder of its own under it, deleted
afterwards) against writing and reading the bytes of torch.save of the same state there with fsspec (the
store's floor), measured in the same run, rotated as above; no stall or memory figures (they do not depend
on where checkpoints go). The credentials come from the environment, as for checkpoint_dir.
Memory: fresh single-rank processes that build the trainer and then do nothing, an async save, a blocking
save or a resume, rotated (3 rounds; --quick: 1); each one's peak RSS minus the baseline's of its
round, over the checkpoint's size, against the target <= 1.2.
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
from hvdazure.bench.benchmark import BenchError, Jobs, Options, RankBenchmark, Result, progress
from hvdazure.bench.checkpoint_workload import PROBES, schedule
from hvdazure.figures import pyplot, save_figure

SAVE_TARGET, LOAD_TARGET, STALL_TARGET, MEMORY_TARGET = 1.1, 1.3, 0.10, 1.2


def _probe(mode: str, mb: int, directory: Path, timeout_s: float | None) -> dict:
    """Peak RSS and checkpoint size (bytes) from a fresh single-rank process (no launcher variables: it must
    not join a job)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMI", "PMIX_"))}
    proc = subprocess.run([sys.executable, "-m", "hvdazure.bench.checkpoint_torch", mode, str(mb),
                           str(directory)], env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise BenchError(f"checkpoint: the {mode} probe failed (exit code {proc.returncode}; output above)")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory(mb: int, rounds: int, timeout_s: float | None) -> dict:
    """Peak RSS of fresh processes that build the trainer and do nothing more, save (async, blocking) or
    resume, rotated; what each adds to its round's baseline, over the checkpoint's size."""
    with tempfile.TemporaryDirectory(prefix="hvdazure-bench-") as folder:
        size = _probe("prepare", mb, Path(folder), timeout_s)["checkpoint_bytes"]
        peaks: dict[str, list[float]] = {mode: [] for mode in PROBES}
        for round_ in range(rounds):
            for mode in PROBES[round_ % len(PROBES):] + PROBES[:round_ % len(PROBES)]:
                peaks[mode].append(_probe(mode, mb, Path(folder), timeout_s)["peak_rss"] / 2**20)
    checkpoint_mb = size / 2**20
    added = {mode: [p - b for p, b in zip(peaks[mode], peaks["baseline"], strict=True)]
             for mode in PROBES if mode != "baseline"}
    return {"checkpoint_mb": checkpoint_mb, "peak_rss_mb": peaks,
            "added_mb": {mode: stats.summary(values) for mode, values in added.items()},
            "added_over_checkpoint": {mode: _figure([v / checkpoint_mb for v in values], MEMORY_TARGET)
                                      for mode, values in added.items()}}


def _figure(values: list[float], target: float | None = None) -> dict:
    """`values` with their median and bootstrap 95% interval; against a `target` (at most), its verdict."""
    interval = stats.bootstrap_interval(values)
    figure = {"values": values, "median": statistics.median(values), "ci95": list(interval)}
    if target is not None:
        figure |= {"target": target, "verdict": stats.verdict(interval, target)}
    return figure


def _ratio(a: list[float], b: list[float], target: float | None = None) -> dict:
    """The per-pair ratios a / b as a _figure."""
    return _figure([x / y for x, y in zip(a, b, strict=True)], target)


def summarize(result: dict, p: dict) -> dict:
    """Save and load ratios per repeat; stall per checkpoint per round, async and blocking, and their
    ratio per round."""
    t, blocks = result["save_load_s"], result["step_s"]
    checkpoints = (p["steps"] - 1) // p["every"]  # steps every, 2 every, ... after the first step
    stall = {saving: [block_stall(steps) / checkpoints for steps in blocks[saving]]
             for saving in ("none", "async", "blocking")}
    return {
        "median_s": {name: statistics.median(values) for name, values in t.items()},
        "save_vs_torch_save_fsync": _ratio(t["hvdazure save"], t["torch.save + fsync"], SAVE_TARGET),
        "save_vs_torch_save": _ratio(t["hvdazure save"], t["torch.save"]),
        "save_vs_floor": _ratio(t["hvdazure save"], t["write + fsync"]),
        "load_vs_torch_load": _ratio(t["hvdazure load"], t["torch.load"], LOAD_TARGET),
        "checkpoints_per_block": checkpoints,
        "stall_s_per_checkpoint": {saving: {"per_round": values, "median": statistics.median(values),
                                            "ci95": list(stats.bootstrap_interval(values))}
                                   for saving, values in stall.items()},  # "none": the method's noise
        "async_stall_over_blocking": _ratio(stall["async"], stall["blocking"], STALL_TARGET),
        "async_copy_over_blocking_stall": statistics.median(t["async copy"]) / statistics.median(
            stall["blocking"]),
        "async_busy_over_blocking_stall": (statistics.median(t["async copy"]) + statistics.median(
            t["hvdazure save, CPU time"])) / statistics.median(stall["blocking"]),
        "step_s_without_checkpoints": statistics.median(d for steps in blocks["none"] for d in steps),
    }


def block_stall(steps: list[float]) -> float:
    """What a block's steps took beyond its typical step: the sum of each step's excess over the block's
    median step. Checkpoints touch a few steps of every `every` (the checkpoint's, and a background
    write's next ones), so the median is an unaffected step's, taken in the same block: drift between
    blocks, large on a shared VM, cancels."""
    typical = statistics.median(steps)
    return sum(steps) - typical * len(steps)


def _line(text: str, figure: dict) -> str:
    low, high = figure["ci95"]
    line = f"  {text}: {figure['median']:.2f} (95% interval {low:.2f}-{high:.2f})"
    return line + (f", target <= {figure['target']}: {figure['verdict']}" if "target" in figure else "")


def check_url(url: str) -> None:
    """A BenchError, in one line, unless `url` is a URL of a store fsspec can reach (with a container or
    bucket where the store has them)."""
    import fsspec

    protocol, _, path = url.partition("://")
    if not protocol or not path.strip("/") or protocol in ("file", "local"):
        raise BenchError(f"--url must be a URL of a store, such as abfs://CONTAINER/PATH, got {url!r}")
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise BenchError(f"--url {url}: fsspec knows no protocol {protocol!r}") from None
    except ImportError as exc:
        raise BenchError(f"--url {url}: {protocol}:// needs a package not installed here ({exc})") from None


def summarize_store(result: dict) -> dict:
    """Save and load on a store, each over the store's floor (the same bytes with fsspec), per repeat."""
    t = result["save_load_s"]
    return {"median_s": {name: statistics.median(values) for name, values in t.items()},
            "save_vs_floor": _ratio(t["hvdazure save"], t["write (fsspec)"]),
            "save_with_retention_vs_floor": _ratio(t["hvdazure save + retention"], t["write (fsspec)"]),
            "load_vs_floor": _ratio(t["hvdazure load"], t["read (fsspec)"])}


class Checkpoint(RankBenchmark):
    """One job of -np ranks (save and load on rank 0, training blocks on every rank), then the memory
    probes; with --url, save and load on that store only."""

    name = "checkpoint"

    def check(self, options: Options) -> None:
        if options.get("url") is not None:
            check_url(options["url"])

    def measure(self, options: Options) -> Result | None:
        """On every rank: save and load on rank 0, then the training blocks; rank 0 returns the figures."""
        from hvdazure.bench.checkpoint_torch import measure_ranks, measure_store

        p = schedule(options["quick"])
        if options.get("url") is not None:
            return measure_store(options["url"], p["mb"], p["repeats"])
        return measure_ranks(p["mb"], p["repeats"], p["pairs"], p["steps"], p["every"], progress=progress)

    def run(self, options: Options, jobs: Jobs) -> Result:
        """The job of -np ranks, then the memory probes (fresh single-rank processes); the summary of both.
        With --url: the job, and the summary of its save and load."""
        p = schedule(options["quick"])
        result = jobs.run_ranks(self.name, options, options["np"])
        if options.get("url") is not None:
            return {**p, **result, "summary": summarize_store(result)}
        progress("checkpoint: memory probes")
        peak = memory(p["mb"], p["memory_rounds"], jobs.timeout_s)
        return {**p, **result, "memory": peak, "summary": summarize(result, p)}

    def table(self, result: Result) -> str:
        s = result["summary"]
        lines = [f"checkpoint: a {result['mb']} MB model (+ optimizer), {result['repeats']} rotated repeats"
                 + (f", on {result['url']}" if result.get("url") else "")]
        lines += [f"  {name:<28}{value:>9.3f} s (median)" for name, value in s["median_s"].items()]
        if result.get("url"):
            return "\n".join([*lines, _line("hvdazure save / write (fsspec) (the store's floor)",
                                              s["save_vs_floor"]),
                               _line("hvdazure save + retention / write (fsspec)",
                                     s["save_with_retention_vs_floor"]),
                               _line("hvdazure load / read (fsspec) (the store's floor)",
                                     s["load_vs_floor"])])
        lines += [_line("hvdazure save / torch.save + fsync", s["save_vs_torch_save_fsync"]),
                  _line("hvdazure save / torch.save (not durable)", s["save_vs_torch_save"]),
                  _line("hvdazure save / write + fsync (the disk's floor)", s["save_vs_floor"]),
                  _line("hvdazure load / torch.load (both into model and optimizer)",
                        s["load_vs_torch_load"])]
        step_ms = s["step_s_without_checkpoints"] * 1e3
        lines.append(f"training on {result['world_size']} rank(s), a step {step_ms:.0f} ms without "
                     f"checkpoints, {s['checkpoints_per_block']} checkpoints per block, {result['pairs']} "
                     "round(s):")
        for saving, st in s["stall_s_per_checkpoint"].items():
            what = ("the same figure without checkpoints (the method's noise)" if saving == "none" else
                    f"stall per {saving} checkpoint")
            lines.append(f"  {what}: {st['median'] * 1e3:.0f} ms (95% interval "
                         f"{st['ci95'][0] * 1e3:.0f} to {st['ci95'][1] * 1e3:.0f} ms)")
        lines.append(_line("async stall / blocking stall", s["async_stall_over_blocking"]))
        copy_ms = s["median_s"]["async copy"] * 1e3
        lines.append(f"  the copy an async checkpoint makes before training goes on: {copy_ms:.0f} ms, "
                     f"{s['async_copy_over_blocking_stall']:.2f} of the blocking stall: the async stall's "
                     "floor")
        cpu_ms = s["median_s"]["hvdazure save, CPU time"] * 1e3
        lines.append(f"  with the write's CPU time ({cpu_ms:.0f} ms): "
                     f"{s['async_busy_over_blocking_stall']:.2f} of the blocking stall: the floor where "
                     "training keeps every core busy")
        peak = result["memory"]
        lines.append(f"rank 0's peak memory above a baseline of "
                     f"{statistics.median(peak['peak_rss_mb']['baseline']):.0f} MB, checkpoint "
                     f"{peak['checkpoint_mb']:.0f} MB, {result['memory_rounds']} round(s):")
        for mode, added in peak["added_mb"].items():
            lines.append(f"  {mode}: +{added['median']:.0f} MB median ({added['min']:.0f} to "
                         f"{added['max']:.0f})")
            lines.append(_line(f"{mode} / checkpoint size", peak["added_over_checkpoint"][mode]))
        return "\n".join(lines)

    def plot(self, result: Result, path: Path) -> None:
        """Save and load times per variant, and the stall per checkpoint, async against blocking."""
        plt = pyplot()

        s = result["summary"]
        if result.get("url"):
            fig, left = plt.subplots(1, 1, figsize=(6, 4))
            names = list(result["save_load_s"])
            left.boxplot([result["save_load_s"][n] for n in names])
            left.set_xticks(range(1, len(names) + 1), names, rotation=20)
            left.set_ylabel("seconds")
            left.set_title(f"save and load on {result['url']}, {result['mb']} MB")
            save_figure(fig, path)
            return
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
    from hvdazure.bench.runner import main

    sys.exit(main("checkpoint"))
