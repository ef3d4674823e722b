"""Training throughput through hvdazure's trainers (TorchTrainer, TensorFlowTrainer) on 1 and N ranks:
samples/s, weak-scaling efficiency, and the ceiling the machine sets.

    hvdazure bench throughput -np 2 [--framework torch|tensorflow|both] [--model cnn|resnet50] [--quick]
        [--json OUT.json] [--plot OUT.png]

In the manner of Horovod's pytorch_synthetic_benchmark.py: synthetic data (a few fixed random samples), a
warm-up (10 steps), then timed batches of steps (10 of 10; --quick: 3 of 2 after 2), through the framework's
trainer (sharding, gradient allreduce, metrics: what a user's training pays); the same model, data and
schedule for both frameworks (throughput_workload.py; the frameworks' sides in throughput_torch.py,
throughput_tf.py), each framework reported on its own (default: both; one that is not installed is skipped
with the reason). Per framework, three runs in one invocation: one single-rank process alone, an N-rank job
started as `hvdazure run` starts jobs (the same batch per rank: weak scaling), and N single-rank processes
at once (no communication: the most N processes get out of this machine's cores, memory bandwidth and
caches, the physical ceiling), in 3 rounds (--quick: 1), the order rotated per round, each run's timed
batches pooled. Every process gets the same threads, cores / N (on a 2-core machine at N = 2: one each), so
that one rank is the unit N ranks are compared with. Reported: the mean samples/s per worker and in total
with a bootstrap 95% interval over the timed batches; weak-scaling efficiency = total(N) / (N x total(1))
against the target >= 0.90; the ceiling's efficiency the same way; and the N-rank job's share of the
ceiling (what communication and the framework cost). The default model is a small CNN on 32x32 images
(batch 64, about 70 ms a step on one core: compute-bound); --model resnet50 (224x224, batch 32) is for GPUs
and needs torchvision (PyTorch) or keras.applications (TensorFlow).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hvdazure.bench import stats
from hvdazure.bench.benchmark import BenchError, Jobs, Options, RankBenchmark, Result, progress
from hvdazure.bench.frameworks import FRAMEWORKS, chosen_frameworks, model_unavailable, not_installed
from hvdazure.bench.machine import threads_per_rank
from hvdazure.bench.throughput_workload import ThroughputSide, batch_schedule, batch_size
from hvdazure.figures import pyplot, save_figure

TARGET = 0.90
DEFAULT_MODEL = "cnn"
EFFICIENCIES = (("weak_scaling_efficiency", "weak-scaling efficiency total(N) / (N x total(1))"),
                ("ceiling_efficiency", "ceiling: N independent processes / (N x total(1))"),
                ("share_of_ceiling", "N ranks / N independent processes"))  # the summary's key, its text


def framework_side(framework: str) -> ThroughputSide:
    """The module that trains the workload on `framework` (imports the framework: on ranks only)."""
    if framework == "tensorflow":
        from hvdazure.bench import throughput_tf

        return throughput_tf
    from hvdazure.bench import throughput_torch

    return throughput_torch



class Throughput(RankBenchmark):
    """Per framework, rounds of three runs: one rank, N ranks, N independent single-rank processes."""

    name = "throughput"

    def check(self, options: Options) -> None:
        for framework in chosen_frameworks(options["framework"]):
            reason = model_unavailable(options["model"] or DEFAULT_MODEL, framework)
            if reason is not None:
                raise BenchError(reason)

    def measure(self, options: Options) -> Result | None:
        """On every rank: train and time; rank 0 returns each rank's samples/s per timed batch."""
        size = batch_size(options["model"], options["quick"])
        rates, world_size = framework_side(options["framework"]).rates_per_rank(
            options["model"], size, batch_schedule(options["quick"]))
        if rates is None:
            return None
        return {"world_size": world_size, "batch_size": size, "rates_per_rank": rates}

    def run(self, options: Options, jobs: Jobs) -> Result:
        """Rounds (3; --quick: 1) of, per framework: one single-rank process alone, the N-rank job, N
        single-rank processes at once, their order rotated per round, so that a machine's changing load hits
        all runs alike; each run's timed batches are pooled over the rounds. A framework that is not
        installed is skipped."""
        n, options = options["np"], {**options, "model": options["model"] or DEFAULT_MODEL}
        env = {"OMP_NUM_THREADS": str(threads_per_rank(n))}
        labels = ["1 rank", f"{n} ranks", f"{n} independent"]
        frameworks: dict[str, Result] = {}
        measured: dict[str, dict[str, Result]] = {}
        for framework in chosen_frameworks(options["framework"]):
            reason = not_installed(framework)
            if reason is not None:
                frameworks[framework] = {"status": "skipped", "reason": reason}
            else:
                frameworks[framework] = {"status": "measured", "trainer": FRAMEWORKS[framework].trainer}
                measured[framework] = {}
        rounds = 1 if options["quick"] else 3
        for round_ in range(rounds):
            for framework, runs in measured.items():
                job = {**options, "framework": framework}
                for label in labels[round_ % 3:] + labels[:round_ % 3]:
                    progress(f"throughput: round {round_ + 1}/{rounds}: {framework}: {label}")
                    if label == f"{n} ranks":
                        run = jobs.run_ranks(self.name, job, n, tag=f" ({framework}, {label})", env=env)
                    else:
                        run = _single_rank_processes(jobs, job, 1 if label == "1 rank" else n, env)
                    if label in runs:
                        pooled_runs = zip(runs[label]["rates_per_rank"], run["rates_per_rank"], strict=True)
                        for pooled, more in pooled_runs:
                            pooled.extend(more)
                    else:
                        runs[label] = run
        for framework, runs in measured.items():
            ordered = {label: runs[label] for label in labels}
            frameworks[framework].update(runs=ordered, summary=summarize(ordered, n))
        return {"model": options["model"], "threads_per_rank": int(env["OMP_NUM_THREADS"]),
                "rounds": rounds, **batch_schedule(options["quick"])._asdict(), "frameworks": frameworks}

    def table(self, result: Result) -> str:
        """Per framework, its runs side by side: samples/s per worker and in total, the efficiencies."""
        lines = [f"throughput: {result['model']}, {result['threads_per_rank']} thread(s) per process, "
                 f"{result['rounds']} round(s) of {result['batches']} timed batches of "
                 f"{result['steps_per_batch']} steps after {result['warmup']}",
                 f"{'run':<34}{'samples/s per worker':>24}{'samples/s total':>24}"]
        for framework, r in result["frameworks"].items():
            if r["status"] != "measured":
                lines.append(f"{framework}: skipped: {r['reason']}")
                continue
            for label, f in r["summary"]["samples_per_s"].items():
                w, t = f["per_worker"], f["total"]
                lines.append(f"{r['trainer'] + ', ' + label:<34}{w['mean']:>12.1f} "
                             f"({w['ci95'][0]:.1f}-{w['ci95'][1]:.1f})"
                             f"{t['mean']:>12.1f} ({t['ci95'][0]:.1f}-{t['ci95'][1]:.1f})")
        for r in result["frameworks"].values():
            if r["status"] != "measured":
                continue
            s = r["summary"]
            lines.append(f"{r['trainer']}:")
            for key, text in EFFICIENCIES:
                e = s[key]
                lines.append(f"  {text}: {e['value']:.3f} (95% interval {e['ci95'][0]:.3f}-"
                             f"{e['ci95'][1]:.3f})")
            lines.append(f"  target weak-scaling efficiency >= {TARGET}: {s['target']['verdict']}")
        return "\n".join(lines)

    def plot(self, result: Result, path: Path) -> None:
        """Total samples/s of each framework's runs with their intervals, and the efficiencies against the
        target."""
        plt = pyplot()

        measured = {r["trainer"]: r["summary"] for r in result["frameworks"].values()
                    if r["status"] == "measured"}
        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
        keys = ["weak_scaling_efficiency", "ceiling_efficiency"]
        width = 0.8 / max(1, len(measured))
        for index, (trainer, s) in enumerate(measured.items()):
            labels = list(s["samples_per_s"])
            totals_ = [s["samples_per_s"][k]["total"] for k in labels]
            means = [t["mean"] for t in totals_]
            offset = [x + index * width for x in range(len(labels))]
            left.bar(offset, means, width, label=trainer, capsize=4,
                     yerr=[[m - t["ci95"][0] for m, t in zip(means, totals_, strict=True)],
                           [t["ci95"][1] - m for m, t in zip(means, totals_, strict=True)]])
            left.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels)
            values = [s[k]["value"] for k in keys]
            right.bar([x + index * width for x in range(len(keys))], values, width, label=trainer,
                      capsize=4, yerr=[[v - s[k]["ci95"][0] for k, v in zip(keys, values, strict=True)],
                                       [s[k]["ci95"][1] - v for k, v in zip(keys, values, strict=True)]])
        left.set_ylabel("samples/s, all processes")
        left.set_title(f"{result['model']} through hvdazure's trainers")
        left.legend()
        right.set_xticks([x + 0.4 - width / 2 for x in range(len(keys))],
                         ["N ranks", "N independent (ceiling)"])
        right.axhline(TARGET, color="C3", linestyle="--", label=f"target {TARGET}")
        right.set_ylabel("efficiency vs N x 1 rank")
        right.legend()
        save_figure(fig, path)


def _single_rank_processes(jobs: Jobs, options: Options, count: int, env: dict[str, str]) -> Result:
    """`count` single-rank processes at once, without a launcher, as one run of `count` workers."""
    results = jobs.single_rank_processes(Throughput.name, options, count, env)
    return {**results[0], "world_size": 1, "processes": count,
            "rates_per_rank": [r["rates_per_rank"][0] for r in results]}


def totals(rates_per_rank: list[list[float]]) -> list[float]:
    """Samples/s of all ranks together, per timed batch."""
    return [sum(batch) for batch in zip(*rates_per_rank, strict=False)]


def summarize(runs: dict, n: int) -> dict:
    """Per run: samples/s per worker and in total; efficiencies with bootstrap intervals."""
    one, many, ceiling = (totals(run["rates_per_rank"]) for run in runs.values())
    figures = {label: {"per_worker": stats.summary([r for rank in run["rates_per_rank"] for r in rank]),
                       "total": stats.summary(totals(run["rates_per_rank"]))} for label, run in runs.items()}

    def ratio(a: list[float], b: list[float], scale: float) -> dict:
        value = (sum(a) / len(a)) / (scale * sum(b) / len(b))
        return {"value": value, "ci95": list(stats.ratio_interval(a, b, scale))}

    efficiency = ratio(many, one, n)
    return {
        "samples_per_s": figures,
        "weak_scaling_efficiency": efficiency,
        "ceiling_efficiency": ratio(ceiling, one, n),
        "share_of_ceiling": ratio(many, ceiling, 1),
        "target": {"weak_scaling_efficiency >=": TARGET,
                   "verdict": stats.at_least_verdict(tuple(efficiency["ci95"]), TARGET) if n > 1 else
                   "not applicable (-np 1)"},
    }


if __name__ == "__main__":
    from hvdazure.bench.runner import main

    sys.exit(main("throughput"))
