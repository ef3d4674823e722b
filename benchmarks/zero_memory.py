"""What `zero_stage` 1 and 2 save per rank: optimizer state bytes and peak memory for a model of about 100 M
parameters (a stack of 10 Linear 3162 -> 3162 layers, float32, 100.0 M parameters) trained by TorchTrainer
with AdamW, at every world size and stage asked for, each in its own job (a peak is a process's):

    PYTHONPATH=. .venv/bin/python benchmarks/zero_memory.py [--ranks 1 2 4] [--stages 0 1 2] [--steps 3]
        [--repeats 2]

launches `hvdazure run -np N --mpi benchmarks/zero_memory.py --rank-run ...` once per (N, stage) and repeat,
one after another. Each rank measures, after the trainer has built its model and optimizer and broadcast the
weights (`on_train_start`): its resident memory then (the baseline), the high-water mark reset (Linux's
`/proc/self/clear_refs`); after `--steps` steps of batch 4 a rank (`on_train_end`): the high-water mark
(VmHWM: the peak), and the bytes of the tensors in `trainer.optimizer.state` (this rank's slice when
sharded). Reported (a table, and benchmarks/results/zero_memory.json), per (N, stage), the largest value
over the ranks: state bytes, state / the unsharded state (stage 0's) against the issue's goal 1/N + 2%, the
peak, the training's rise over the baseline, the gradients kept (full at stages 0 and 1, the slice at stage
2) and the rest of the rise: what the exchange's buffers (fusion buffer, flat copies, allgathered weights)
and the step's transients cost; and, for the sharded stages, the rise at the peak of each phase of the step
(forward+backward, the gradients' exchange, the optimizer, the weights' allgather: ShardedOptimizer.exchange
and gather_weights wrapped, the high-water mark read and reset around them). The peak depends a little on
when the collectives complete: each (N, stage) runs `--repeats` times (the rounds through all of them in
turn), its peak, rise and rest the median with min-max.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "zero_memory.json"
WIDTH, LAYERS = 3162, 10  # 10 x (3162 x 3162 + 3162) = 100.0 M parameters
BATCH = 4
GOAL_SLACK = 0.02  # the goal: state per rank <= 1/N + 2% of the unsharded state
MB = 1e6
PHASES = ("forward+backward", "exchange", "optimizer", "allgather")  # of a sharded step, in order


def code_version() -> str:
    """The commit measured, and hvdazure's files that differ from it (others work in the same tree)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout

    changed = [line[3:] for line in git("status", "--porcelain", "--", "hvdazure").splitlines()]
    head = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    return head + (f" with uncommitted {', '.join(changed)}" if changed else "")


def proc_status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak() -> None:
    """Reset this process's resident high-water mark (VmHWM) to its current resident size."""
    Path("/proc/self/clear_refs").write_text("5")


def rank_run(stage: int, steps: int, out_dir: str) -> None:
    """One rank of one job: train `steps` steps at `stage`, write this rank's measurements to `out_dir`."""
    import torch
    from torch.utils.data import TensorDataset

    from hvdazure import Callback, TrainConfig
    from hvdazure.torch import TorchTrainer

    class MemoryProbe(Callback):
        """The baseline after setup, the training's peak, and (sharded) the peak of each phase of the step:
        the high-water mark read and reset where ShardedOptimizer's exchange and gather_weights begin and
        end, the highest seen kept."""

        def __init__(self) -> None:
            self.facts: dict[str, Any] = {"phase_peaks": {}}
            self.peak = 0

        def mark(self, phase_ended: str | None) -> None:
            high = proc_status_bytes("VmHWM")
            self.peak = max(self.peak, high)
            if phase_ended is not None:
                peaks = self.facts["phase_peaks"]
                peaks[phase_ended] = max(peaks.get(phase_ended, 0), high - self.facts["baseline_rss"])
            reset_peak()

        def on_train_start(self, trainer: Any) -> None:
            self.facts["baseline_rss"] = proc_status_bytes("VmRSS")
            reset_peak()

        def on_step_begin(self, trainer: Any) -> None:
            self.mark(None)

        def around(self, method: Any, before: str, after: str) -> Any:
            def measured(sharded: Any) -> None:
                self.mark(before)
                method(sharded)
                self.mark(after)
            return measured

        def on_train_end(self, trainer: Any) -> None:
            self.mark(None)
            self.facts["peak_rss"] = self.peak
            self.facts["end_rss"] = proc_status_bytes("VmRSS")
            self.facts["state_bytes"] = sum(
                v.numel() * v.element_size() for s in trainer.optimizer.state.values() for v in s.values()
                if isinstance(v, torch.Tensor))

    class Stack(TorchTrainer):
        def build_model(self) -> torch.nn.Module:
            torch.manual_seed(0)
            layers: list[torch.nn.Module] = []
            for _ in range(LAYERS):
                layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
            return torch.nn.Sequential(*layers[:-1])

        def build_optimizer(self, params: Any, lr: float) -> torch.optim.Optimizer:
            return torch.optim.AdamW(params, lr=lr)

        def train_dataset(self) -> TensorDataset:
            return TensorDataset(torch.randn(steps * BATCH * self.world_size, WIDTH,
                                             generator=torch.Generator().manual_seed(0)))

        def training_step(self, net: torch.nn.Module, batch: Any) -> torch.Tensor:
            return net(batch[0]).pow(2).mean()

    probe = MemoryProbe()
    from hvdazure.torch import zero  # the step's phases, measured apart (a benchmark's patch)

    sharded = zero.ShardedOptimizer
    sharded.exchange = probe.around(sharded.exchange, *PHASES[:2])  # type: ignore[method-assign]
    sharded.gather_weights = probe.around(sharded.gather_weights, *PHASES[2:])  # type: ignore[method-assign]
    trainer = Stack(TrainConfig(epochs=1, batch_size=BATCH, lr=1e-4, progress_bar=False, zero_stage=stage),
                    callbacks=[probe])
    trainer.fit()
    params = sum(p.numel() for p in trainer.model.parameters())
    row = {"rank": trainer.rank, "world_size": trainer.world_size, "stage": stage, "params": params,
           "param_bytes": params * 4, **probe.facts}
    Path(out_dir, f"np{trainer.world_size}-s{stage}-rank{trainer.rank}.json").write_text(json.dumps(row))


def summarize(ranks: list[dict[str, Any]], unsharded_state: int) -> dict[str, Any]:
    """One (N, stage)'s row from its ranks' measurements: each figure the largest over the ranks (the rank
    that needs the most memory is the one that decides whether a model fits)."""
    first = ranks[0]
    n, stage, param_bytes = first["world_size"], first["stage"], first["param_bytes"]
    state = max(r["state_bytes"] for r in ranks)
    rise = max(r["peak_rss"] - r["baseline_rss"] for r in ranks)
    grads_kept = param_bytes if stage < 2 else -(-param_bytes // n)
    ratio = state / unsharded_state
    goal = 1 / n + GOAL_SLACK
    return {"world_size": n, "stage": stage, "params": first["params"], "param_bytes": param_bytes,
            "state_bytes": state, "state_ratio": ratio, "goal": goal,
            "goal_met": ratio <= goal if stage else None,  # the goal is the sharded stages'
            "peak_rss": max(r["peak_rss"] for r in ranks),
            "baseline_rss": max(r["baseline_rss"] for r in ranks),
            "training_rise": rise, "grads_kept_bytes": grads_kept, "rest_bytes": rise - state - grads_kept,
            "phase_peaks": {phase: max(r["phase_peaks"][phase] for r in ranks) for phase in PHASES
                            if all(phase in r["phase_peaks"] for r in ranks)},
            "ranks": ranks}


SPREAD = ("peak_rss", "baseline_rss", "training_rise", "rest_bytes")  # what varies from run to run


def combine(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """One (N, stage)'s row over its repeats: the figures that vary with the collectives' timing (the peak,
    the rise, the rest, each phase's peak) their median, with min and max; the rest as the first repeat's."""
    row = {**repeats[0], "repeats": repeats}
    for key in SPREAD:
        row[key] = statistics.median(r[key] for r in repeats)
        row[f"{key}_spread"] = {"min": min(r[key] for r in repeats), "max": max(r[key] for r in repeats)}
    row["phase_peaks"] = {phase: statistics.median(r["phase_peaks"][phase] for r in repeats)
                          for phase in repeats[0]["phase_peaks"]}
    row["state_bytes"] = max(r["state_bytes"] for r in repeats)
    row["state_ratio"] = max(r["state_ratio"] for r in repeats)
    row["goal_met"] = None if row["goal_met"] is None else all(r["goal_met"] for r in repeats)
    del row["ranks"]
    return row


def megabytes(row: dict[str, Any], key: str) -> str:
    """`row[key]` in MB, with its min-max over the repeats when they differ."""
    spread = row.get(f"{key}_spread")
    if spread is None or round(spread["min"] / MB) == round(spread["max"] / MB):
        return f"{row[key] / MB:.0f}"
    return f"{row[key] / MB:.0f} ({spread['min'] / MB:.0f}-{spread['max'] / MB:.0f})"


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of the summarized (or combined) rows (RESULTS.md's), sizes in MB (10^6 bytes);
    a combined row's varying figures are medians over the repeats, with min-max when they differ."""
    lines = ["| ranks | stage | state MB/rank | state / unsharded | goal 1/N + 2% | peak RSS MB | "
             "rise in training MB | grads kept MB | rest (buffers, transients) MB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        verdict = "unsharded" if r["goal_met"] is None else "met" if r["goal_met"] else "not met"
        lines.append(f"| {r['world_size']} | {r['stage']} | {r['state_bytes'] / MB:.0f} | "
                     f"{r['state_ratio']:.3f} | {r['goal']:.3f} ({verdict}) | {megabytes(r, 'peak_rss')} | "
                     f"{megabytes(r, 'training_rise')} | {r['grads_kept_bytes'] / MB:.0f} | "
                     f"{megabytes(r, 'rest_bytes')} |")
    return "\n".join(lines)


def phase_table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of where a sharded step's peak is: the rise over the baseline at the highest point
    of each phase, in MB (stage 0's step has no phases measured: not listed)."""
    lines = [f"| ranks | stage | {' | '.join(PHASES)} |", "| --- | --- |" + " --- |" * len(PHASES)]
    for r in rows:
        if r["phase_peaks"]:
            peaks = r["phase_peaks"]
            cells = " | ".join(f"{peaks[p] / MB:.0f}" if p in peaks else "-" for p in PHASES)
            lines.append(f"| {r['world_size']} | {r['stage']} | {cells} |")
    return "\n".join(lines)


def unsharded_state_bytes(by_job: dict[tuple[int, int], list[dict[str, Any]]]) -> int:
    """The unsharded optimizer state: stage 0's, measured (the same at every N), else AdamW's two moments
    and a step count (a 4-byte scalar) per parameter tensor."""
    for (_, stage), ranks in sorted(by_job.items()):
        if stage == 0:
            return int(ranks[0]["state_bytes"])
    first = next(iter(by_job.values()))[0]
    return int(2 * first["param_bytes"] + 4 * 2 * LAYERS)


def drive(world_sizes: list[int], stages: list[int], steps: int, repeats: int, timeout: int) -> None:
    """Launch one job per (N, stage) and repeat, the repeats one after another through all of them (so
    that the machine's drifting load falls on every row alike), then summarize, print and write."""
    hvdazure = str(Path(sys.executable).parent / "hvdazure")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    by_job: dict[tuple[int, int], list[list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory() as out_dir:
        for repeat in range(repeats):
            for n in world_sizes:
                for stage in stages:
                    command = [hvdazure, "run", "-np", str(n), "--mpi", "--timeout", str(timeout),
                               str(Path(__file__).resolve()), "--rank-run", "--stage", str(stage),
                               "--steps", str(steps), "--out", out_dir]
                    print(f"repeat {repeat + 1}/{repeats}, N={n} stage={stage}", flush=True)
                    subprocess.run(command, env=env, check=True, timeout=timeout + 60)
                    files = [Path(out_dir, f"np{n}-s{stage}-rank{r}.json") for r in range(n)]
                    by_job.setdefault((n, stage), []).append([json.loads(f.read_text()) for f in files])
    unsharded = unsharded_state_bytes({job: runs[0] for job, runs in by_job.items()})
    rows = [combine([summarize(ranks, unsharded) for ranks in runs]) for _, runs in sorted(by_job.items())]
    import torch

    from hvdazure import TrainConfig

    print(table(rows))
    print("\nThe rise over the baseline at each phase's peak, MB:")
    print(phase_table(rows))
    write_result(RESULT, {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"PYTHONPATH=. .venv/bin/python benchmarks/zero_memory.py --ranks "
                   f"{' '.join(map(str, world_sizes))} --stages {' '.join(map(str, stages))} --steps {steps} "
                   f"--repeats {repeats}",
        "model": f"{LAYERS} x Linear({WIDTH}, {WIDTH}), float32, AdamW, batch {BATCH} a rank, CPU",
        "torch": torch.__version__, "controller": "mpi", "code": code_version(),
        "zero_bucket_mb": TrainConfig().zero_bucket_mb, "unsharded_state_bytes": unsharded,
        "load_average": os.getloadavg(), "rows": rows})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--stages", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="jobs per (N, stage): peaks vary a little")
    parser.add_argument("--timeout", type=int, default=900, help="seconds a job may take")
    parser.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stage", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_run:
        rank_run(args.stage, args.steps, args.out)
    else:
        drive(args.ranks, args.stages, args.steps, args.repeats, args.timeout)


if __name__ == "__main__":
    main()
