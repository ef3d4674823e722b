"""What the scripts here share: the JSON report, and the compiled-against-eager pairing. (What users run,
`hvdazure bench`, is in hvdazure/bench/.)"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_result(path: Path, result: dict) -> None:
    """Write a benchmark's result as JSON (creating its folder) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")


COMPILE_VARIANTS = ("eager", "compiled")


def spread(values: list[float], scale: float = 1.0) -> dict[str, float]:
    """Median, min and max of `values`, each times `scale`: the spread a result reports, not one run."""
    return {"median": statistics.median(values) * scale, "min": min(values) * scale,
            "max": max(values) * scale}


def compiled_vs_eager(block: Callable[[bool], tuple[float, float]], pairs: int,
                      is_main: bool) -> dict[str, Any]:
    """Runs `block(compiled)` (seconds per step, first step's seconds) in `pairs` eager/compiled pairs after a
    warm-up pair (which compiles), the order alternating so that the machine's drifting load falls on both
    alike; returns the per-step milliseconds, the per-pair ratio and the first steps, as the two compile
    benchmarks (PyTorch's and TensorFlow's) report them."""
    per_step: dict[str, list[float]] = {name: [] for name in COMPILE_VARIANTS}
    first_step: dict[str, float] = {}
    started = time.monotonic()
    for pair in range(pairs + 1):  # pair 0 warms up (and compiles)
        for name in COMPILE_VARIANTS if pair % 2 else COMPILE_VARIANTS[::-1]:
            seconds, first = block(name == "compiled")
            first_step.setdefault(name, first)
            if pair:
                per_step[name].append(seconds)
        if is_main and pair:
            print(f"pair {pair}/{pairs} ({time.monotonic() - started:.0f} s)", flush=True)
    ratios = [c / e for c, e in zip(per_step["compiled"], per_step["eager"], strict=True)]
    return {"ms_per_step": {name: spread(values, 1e3) for name, values in per_step.items()},
            "ratio_compiled_to_eager": spread(ratios), "first_step_s": first_step, "pairs": pairs}


def print_compiled_vs_eager(result: dict[str, Any]) -> None:
    """The table of compiled_vs_eager's result (with the run's load average)."""
    ms, ratio, first_step = result["ms_per_step"], result["ratio_compiled_to_eager"], result["first_step_s"]
    print(f"{'':<10}{'ms/step median':>16}{'min':>9}{'max':>9}{'first step s':>14}")
    for name in COMPILE_VARIANTS:
        print(f"{name:<10}{ms[name]['median']:>16.2f}{ms[name]['min']:>9.2f}{ms[name]['max']:>9.2f}"
              f"{first_step[name]:>14.2f}")
    print(f"compiled / eager per pair: median {ratio['median']:.3f} (min {ratio['min']:.3f}, max "
          f"{ratio['max']:.3f}) over {result['pairs']} pairs; load average {result['load_average'][0]:.1f}")
