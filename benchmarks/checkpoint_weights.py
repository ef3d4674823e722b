"""Verified `load_weights` against a bare `torch.load` of the same file: what checking every byte of a
checkpoint against its manifest costs someone who loads weights for inference.

    PYTHONPATH=. python benchmarks/checkpoint_weights.py [--mb 100] [--pairs 15] [--json OUT.json]

One checkpoint of a `--mb` MB model (+ its SGD optimizer) is saved the trainer's way; its model.pt is
copied beside it, so both sides read the same bytes from the page cache. Each round times, in an order
rotated from round to round after one unrecorded round, three loads into the model (`load_state_dict` of
what was returned: the weights in use, so that a load that maps the file pays for touching it):

- "load_weights": `hvdazure.torch.load_weights(directory)`: the newest checkpoint found, every file read
  once through its hash and checked against the manifest, then the weights loaded;
- "torch.load": `torch.load(copy, weights_only=True)`: the bare load a user would write instead;
- "torch.load, mmap": the same, memory-mapped: the floor of any load of this file.

The ratio load_weights / torch.load per round (the rounds interleave the variants, so drift on a shared
machine cancels), its median with a bootstrap 95% interval, against the target <= 1.2; and load_weights /
torch.load, mmap (no target). Single process, no Horovod job. The figures come from a fresh process; the
JSON holds every round's seconds.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hvdazure.bench import stats

TARGET = 1.2
VARIANTS = ("load_weights", "torch.load", "torch.load, mmap")


def measure(mb: int, pairs: int) -> dict[str, Any]:
    """Seconds per variant and round (VARIANTS), rotated, after one unrecorded round."""
    import torch

    from hvdazure.core.checkpoint.store import CheckpointManager
    from hvdazure.torch import load_weights
    from hvdazure.torch.checkpoint_content import MODEL_FILE, TorchCheckpointContent

    side = int((mb * 2**20 / 4) ** 0.5)
    model = torch.nn.Linear(side, side, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with tempfile.TemporaryDirectory(prefix="hvdazure-bench-") as folder:
        directory = Path(folder) / "checkpoints"
        content = TorchCheckpointContent(model, optimizer, None, torch.device("cpu"))
        saved = CheckpointManager(str(directory)).save(1, content.save_files(copy=False), {})
        bare = Path(folder) / "bare.pt"
        shutil.copyfile(directory / saved.name / MODEL_FILE, bare)
        loads: dict[str, Callable[[], Any]] = {
            "load_weights": lambda: load_weights(str(directory)),
            "torch.load": lambda: torch.load(bare, weights_only=True),
            "torch.load, mmap": lambda: torch.load(bare, weights_only=True, mmap=True)}
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for round_ in range(-1, pairs):  # round -1 warms up: first allocations, the files in the page cache
            shift = max(round_, 0) % len(VARIANTS)
            for name in VARIANTS[shift:] + VARIANTS[:shift]:
                start = time.perf_counter()
                model.load_state_dict(loads[name]())
                seconds = time.perf_counter() - start
                if round_ >= 0:
                    times[name].append(seconds)
    size = sum(record["bytes"] for record in saved.manifest["files"].values())
    return {"mb": mb, "pairs": pairs, "checkpoint_bytes": size, "load_s": times, "torch": torch.__version__}


def _figure(ratios: list[float], target: float | None = None) -> dict[str, Any]:
    interval = stats.bootstrap_interval(ratios)
    figure: dict[str, Any] = {"values": ratios, "median": statistics.median(ratios), "ci95": list(interval),
                              "min": min(ratios), "max": max(ratios)}
    if target is not None:
        figure |= {"target": target, "verdict": stats.verdict(interval, target)}
    return figure


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    t = result["load_s"]
    return {"median_s": {name: statistics.median(values) for name, values in t.items()},
            "load_weights_vs_torch_load": _figure([a / b for a, b in zip(t["load_weights"], t["torch.load"],
                                                                       strict=True)], TARGET),
            "load_weights_vs_torch_load_mmap": _figure([a / b for a, b in zip(
                t["load_weights"], t["torch.load, mmap"], strict=True)])}


def table(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [f"load_weights: a {result['mb']} MB model, {result['pairs']} rotated rounds, each load into the "
             "model"]
    lines += [f"  {name:<20}{value * 1e3:>8.1f} ms (median)" for name, value in s["median_s"].items()]
    for key, text in (("load_weights_vs_torch_load", "load_weights / torch.load"),
                      ("load_weights_vs_torch_load_mmap", "load_weights / torch.load, mmap")):
        f = s[key]
        line = (f"  {text}: {f['median']:.2f} (95% interval {f['ci95'][0]:.2f}-{f['ci95'][1]:.2f}, "
                f"rounds {f['min']:.2f}-{f['max']:.2f})")
        lines.append(line + (f", target <= {f['target']}: {f['verdict']}" if "target" in f else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/checkpoint_weights.py",
                                     description="verified load_weights against a bare torch.load")
    parser.add_argument("--mb", type=int, default=100, help="the model's size in MB (default 100)")
    parser.add_argument("--pairs", type=int, default=15,
                        help="rotated rounds of the three loads (default 15)")
    parser.add_argument("--json", help="write the result, every round's seconds included, to this file")
    args = parser.parse_args(argv)
    if args.pairs < 2 or args.mb < 1:
        parser.error("--pairs must be at least 2 and --mb at least 1")
    result = measure(args.mb, args.pairs)
    result |= {"summary": summarize(result), "python": platform.python_version(),
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
