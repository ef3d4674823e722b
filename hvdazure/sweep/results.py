"""A sweep's results, from its Optuna study: a console table, results.json, results.csv, the best trial's
parameters as a YAML that `--config` accepts, and a plot (matplotlib)."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdazure.figures import pyplot, save_figure
from hvdazure.sweep.coordinator import RUNNING, trial_dir
from hvdazure.sweep.options import SweepOptions
from hvdazure.sweep.space import SearchSpace, overrides

RESULTS_JSON, RESULTS_CSV, BEST_YAML, PLOT_PNG = "results.json", "results.csv", "best.yaml", "sweep.png"


@dataclass(frozen=True)
class SweepResults:
    """One row per trial, and which one is best."""

    options: SweepOptions
    rows: list[dict[str, Any]]
    best: dict[str, Any] | None

    def table(self) -> str:
        metric = self.options.metric
        names = sorted({k for row in self.rows for k in row["params"]})
        header = ["trial", *names, metric, "state", "epochs", "duration"]
        lines = [header]
        for row in self.rows:
            value = row["value"]
            lines.append([str(row["trial"]), *(_fmt(row["params"].get(n)) for n in names),
                          _fmt(value) if value is not None else "-", row["state"], str(row["epochs"] or "-"),
                          f"{row['duration_s']:.1f} s" if row["duration_s"] is not None else "-"])
        widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
        text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                for line in lines]
        text.insert(1, "  ".join("-" * w for w in widths))
        if self.best is not None:
            text.append(f"best: trial {self.best['trial']}, {metric} {_fmt(self.best['value'])} "
                        f"({self.options.mode}); config: {Path(self.options.output) / BEST_YAML}")
        else:
            text.append("best: none (no trial completed)")
        return "\n".join(text)


def collect(options: SweepOptions, study: Any) -> SweepResults:
    rows = []
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        state = attrs.get("state", RUNNING)
        rows.append({
            "trial": trial.number, "state": state, "params": dict(trial.params),
            "value": attrs.get("best"), "final": attrs.get("final"), "epochs": attrs.get("epochs"),
            "duration_s": attrs.get("duration_s"), "start": attrs.get("start"), "end": attrs.get("end"),
            "ranks": attrs.get("ranks"), "seed": attrs.get("seed"), "error": attrs.get("error"),
            "intermediate": {str(k): v for k, v in sorted(trial.intermediate_values.items())},
            "dir": str(trial_dir(options.output_dir, trial.number)),
        })
    done = [r for r in rows if r["state"] == "complete"]
    best = None
    if done:
        pick = min if options.mode == "min" else max
        best = pick(done, key=lambda r: r["value"])
    return SweepResults(options, rows, best)


def write_results(options: SweepOptions, study: Any, space: SearchSpace) -> SweepResults:
    """Write results.json, results.csv, best.yaml (when a trial completed) and sweep.png."""
    import yaml

    results = collect(options, study)
    out = options.output_dir
    (out / RESULTS_JSON).write_text(json.dumps({
        "settings": options.to_dict(), "space": {p.name: p.describe() for p in space.parameters},
        "best": results.best, "trials": results.rows}, indent=2, default=str) + "\n")
    names = space.names
    with open(out / RESULTS_CSV, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["trial", *names, options.metric, "final", "state", "epochs", "duration_s", "seed",
                         "error"])
        for r in results.rows:
            writer.writerow([r["trial"], *(r["params"].get(n) for n in names), r["value"], r["final"],
                             r["state"], r["epochs"], r["duration_s"], r["seed"], r["error"] or ""])
    if results.best is not None:
        best = results.best
        config = {**overrides(best["params"]), "seed": best["params"].get("seed", best["seed"])}
        header = (f"# best trial {best['trial']} of the sweep in {out}: {options.metric} {best['value']}\n"
                  f"# hvdazure run -np N {options.script} --config {out / BEST_YAML} "
                  f"{' '.join(options.script_args)}\n")
        (out / BEST_YAML).write_text(header + yaml.safe_dump(config, sort_keys=False))
    plot(results, out / PLOT_PNG)
    return results


def plot(results: SweepResults, path: Path) -> None:
    """The metric of each trial with the best so far, and the metric against each parameter."""
    plt = pyplot()

    metric, rows = results.options.metric, [r for r in results.rows if _number(r["value"])]
    names = sorted({k for r in results.rows for k in r["params"]})[:4]
    fig, axes = plt.subplots(1, 1 + len(names), figsize=(4.5 * (1 + len(names)), 3.6), squeeze=False)
    ax = axes[0][0]
    colours = {"complete": "tab:blue", "pruned": "tab:orange", "diverged": "tab:red", "failed": "tab:red"}
    for state, colour in colours.items():
        chosen = [r for r in rows if r["state"] == state]
        ax.scatter([r["trial"] for r in chosen], [r["value"] for r in chosen], c=colour, label=state, s=18)
    complete = sorted((r for r in rows if r["state"] == "complete"), key=lambda r: r["trial"])
    if complete:
        pick = min if results.options.mode == "min" else max
        best_so_far, current = [], None
        for r in complete:
            current = r["value"] if current is None else pick(current, r["value"])
            best_so_far.append(current)
        ax.step([r["trial"] for r in complete], best_so_far, where="post", c="black", lw=1,
                label="best so far")
    ax.set(xlabel="trial", ylabel=metric, title="metric by trial")
    ax.legend(fontsize=7)
    for ax, name in zip(axes[0][1:], names, strict=True):
        chosen = [r for r in rows if name in r["params"]]
        xs = [r["params"][name] for r in chosen]
        if all(_number(x) for x in xs):
            ax.scatter(xs, [r["value"] for r in chosen], s=18,
                       c=[colours.get(r["state"], "grey") for r in chosen])
            if xs and min(xs) > 0 and max(xs) / min(xs) > 100:
                ax.set_xscale("log")
        else:
            labels = sorted({str(x) for x in xs})
            ax.scatter([labels.index(str(x)) for x in xs], [r["value"] for r in chosen], s=18)
            ax.set_xticks(range(len(labels)), labels)
        ax.set(xlabel=name, ylabel=metric)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def load(options: SweepOptions) -> SweepResults | None:
    """The results a sweep wrote into its output folder, or None if it wrote none."""
    path = options.output_dir / RESULTS_JSON
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return SweepResults(options, data["trials"], data["best"])
