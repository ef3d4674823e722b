"""hvdazure side by side with what users would pick instead: torchrun + DDP, Lightning's Trainer, HF
Accelerate and tf.distribute's MultiWorkerMirroredStrategy, on the same model, data, batch and ranks.

    hvdazure bench peers -np 2 [--framework torch|tensorflow|both] [--model mlp|cnn|resnet50] [--rounds R]
        [--quick] [--json OUT.json] [--plot OUT.png]

Each peer trains the same model (models.py: by default both regimes, `mlp`, latency-bound, and `cnn`,
compute-bound) on the same synthetic data with the same batch per rank, SGD with momentum, fp32 and N
processes, started as its own users start it (PEERS below: torchrun, Lightning's own launcher, `accelerate
launch`, one process per worker with TF_CONFIG on 127.0.0.1, `hvdazure run --gloo` and `--mpi`), each its
script in peer_scripts/. Every process gets the same threads, cores / N. A run is one epoch of warm-up and
timed steps (peers_workload.STEPS); each rank notes when each step ended. Per run: steady-state samples/s
(the timed steps' samples over their time, on the slowest rank), the time from launch to the end of the
first step on every rank, the launcher's wall time start to exit, and each rank's peak RSS. Rounds (default
5; --quick: 1 of a few steps, a check that everything runs, not a measurement) run every peer once, the
order rotated per round, so that a machine's changing load hits all alike; each hvdazure run is paired
with every peer's run of the same round. Reported per regime: each figure's mean with a bootstrap 95%
interval over the rounds, and the ratios hvdazure / peer as the median of the per-round ratios with a
bootstrap 95% interval, against the targets: samples/s at least 1.0 x the fastest peer's when
compute-bound, 0.95 x when latency-bound, and time to the first step no longer than the slowest peer's. A
peer that cannot run here (a package or launcher missing) is skipped with the reason, never faked; one that
fails is left out of that regime with its error, and the others are measured.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hvdazure.bench import processes, stats
from hvdazure.bench.benchmark import BenchError, Benchmark, Jobs, Options, Result, progress
from hvdazure.bench.frameworks import chosen_frameworks, model_unavailable
from hvdazure.bench.machine import threads_per_rank
from hvdazure.bench.models import MODELS
from hvdazure.bench.peers_workload import LAUNCHED_AT, PeerSpec
from hvdazure.figures import pyplot, save_figure

SCRIPTS = Path(__file__).parent / "peer_scripts"
LATENCY_BOUND = ("mlp",)  # the regimes whose target is 0.95 x; the others are compute-bound (1.0 x)
TARGETS = {"latency-bound": 0.95, "compute-bound": 1.0}
DEFAULT_MODELS = ("mlp", "cnn")
DEFAULT_ROUNDS = 5


@dataclass(frozen=True)
class Launch:
    """Where a peer's run starts: the ranks' count, the script and its spec, a free port, a scratch folder
    (for a hostfile) and whether there are GPUs."""

    np: int
    script: str
    spec: str
    port: int
    folder: Path
    gpus: bool


Command = tuple[list[str], dict[str, str]]  # argv, and what it adds to the environment
LaunchCommands = Callable[[Launch], list[Command]]  # the processes a peer's run starts, together


@dataclass(frozen=True)
class Peer:
    """One way of training data-parallel: its name in the report, its framework, its script in
    peer_scripts/, the modules it needs, how its users start it, and a program it needs on PATH."""

    name: str
    framework: str
    script: str
    needs: tuple[str, ...]
    commands: LaunchCommands
    program: str | None = None

    @property
    def is_hvdazure(self) -> bool:
        return is_hvdazure(self.name)

    def missing(self) -> str | None:
        """Why this peer cannot run here, or None."""
        for module in self.needs:
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed (pip install -e '.[bench]' or scripts/setup_env.sh)"
        if self.program is not None and _program(self.program) is None:
            return f"{self.program} is not on PATH"
        return None


def is_hvdazure(name: str) -> bool:
    """Whether the peer called `name` is hvdazure itself (whose ratios to the others are reported)."""
    return name.startswith("hvdazure")


def _program(name: str) -> str | None:
    beside = Path(sys.executable).parent / name  # the venv's own launcher first, as `hvdazure run` does
    return str(beside) if beside.is_file() else shutil.which(name)


def _hvdazure_run(controller: str) -> LaunchCommands:
    def commands(launch: Launch) -> list[Command]:
        return [([sys.executable, "-m", "hvdazure.cli", "run", "-np", str(launch.np), f"--{controller}",
                  launch.script, launch.spec], {})]
    return commands


def _torchrun(launch: Launch) -> list[Command]:
    return [([str(_program("torchrun")), "--standalone", f"--nproc-per-node={launch.np}", launch.script,
              launch.spec], {})]


def _lightning(launch: Launch) -> list[Command]:
    return [([sys.executable, launch.script, launch.spec, str(launch.np)],
             {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(launch.port)})]


def _accelerate(launch: Launch) -> list[Command]:
    """`accelerate launch`: --multi_gpu on GPUs; on CPUs its multi-CPU launcher, mpirun with a hostfile."""
    head = [str(_program("accelerate")), "launch", "--num_processes", str(launch.np), "--num_machines", "1"]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(launch.port)}
    if launch.gpus:
        return [([*head, "--multi_gpu", "--main_process_port", str(launch.port), launch.script, launch.spec],
                 env)]
    hostfile = launch.folder / "hostfile"
    hostfile.write_text(f"localhost slots={launch.np}\n")
    root = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
    return [([*head, "--cpu", "--mpirun_hostfile", str(hostfile), launch.script, launch.spec],
             {**env, **root})]


def _tf_config_workers(launch: Launch) -> list[Command]:
    """One process per worker, each with TF_CONFIG naming the cluster (127.0.0.1) and its own index."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(launch.np)]}
    return [([sys.executable, launch.script, launch.spec],
             {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})})
            for i in range(launch.np)]


PEERS = (
    Peer("hvdazure (Gloo)", "torch", "hvdazure_torch.py", ("torch", "horovod"), _hvdazure_run("gloo")),
    Peer("hvdazure (MPI)", "torch", "hvdazure_torch.py", ("torch", "horovod"), _hvdazure_run("mpi"),
         "mpirun"),
    Peer("torchrun + DDP", "torch", "ddp.py", ("torch",), _torchrun, "torchrun"),
    Peer("Lightning Trainer", "torch", "lightning_trainer.py", ("torch", "lightning"), _lightning),
    Peer("HF Accelerate", "torch", "accelerate_loop.py", ("torch", "accelerate"), _accelerate, "accelerate"),
    Peer("hvdazure (Gloo)", "tensorflow", "hvdazure_tf.py", ("tensorflow", "horovod"), _hvdazure_run("gloo")),
    Peer("hvdazure (MPI)", "tensorflow", "hvdazure_tf.py", ("tensorflow", "horovod"), _hvdazure_run("mpi"),
         "mpirun"),
    Peer("MultiWorkerMirroredStrategy", "tensorflow", "keras_mwms.py", ("tensorflow", "tf_keras"),
         _tf_config_workers),
)


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def regime(model: str) -> str:
    return "latency-bound" if model in LATENCY_BOUND else "compute-bound"


def chosen_models(model: str | None) -> list[str]:
    return list(DEFAULT_MODELS) if model is None else [model]



def has_gpus() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


# --- one run ------------------------------------------------------------------------------------------
def run_peer(peer: Peer, spec: PeerSpec, np_: int, threads: int, timeout_s: float | None,
             gpus: bool) -> Result:
    """Launch one run of `peer` as its users do, wait for it, read every rank's result; its figures."""
    folder = Path(spec.out_dir)
    spec_path = folder / "spec.json"
    spec.write(spec_path)
    launch = Launch(np_, str(SCRIPTS / peer.script), str(spec_path), free_ports(1)[0], folder, gpus)
    commands = peer.commands(launch)
    base = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2"}
    started = time.time()
    base[LAUNCHED_AT] = repr(started)
    launchers = [processes.Command(argv, {**base, **env}, folder / f"launcher{i}.log")
                 for i, (argv, env) in enumerate(commands)]
    codes = processes.run_together(launchers, timeout_s,
                                   f"peers: {peer.name} ({peer.framework}, {spec.model})")
    wall = time.time() - started
    if any(codes):
        tail = "; ".join(line for command in launchers for line in command.last_lines(3))
        raise BenchError(f"peers: {peer.name} ({peer.framework}, {spec.model}) failed (exit codes {codes}): "
                         f"{tail[-600:]}")
    ranks = sorted((json.loads(p.read_text()) for p in folder.glob("rank*.json")), key=lambda r: r["rank"])
    if [r["rank"] for r in ranks] != list(range(np_)):
        raise BenchError(f"peers: {peer.name} ({peer.framework}, {spec.model}) wrote results for ranks "
                         f"{[r['rank'] for r in ranks]}, expected 0-{np_ - 1}")
    return run_figures(ranks, spec, wall)


def run_figures(ranks: list[dict[str, Any]], spec: PeerSpec, wall_s: float) -> Result:
    """One run's figures from its ranks' results: steady-state samples/s over the timed steps of the slowest
    rank, time from launch to the first step's end on every rank, wall time, peak RSS per rank."""
    world = ranks[0]["world_size"]
    for r in ranks:
        if len(r["step_ends"]) != spec.steps:
            raise BenchError(f"peers: rank {r['rank']} ran {len(r['step_ends'])} steps, expected "
                             f"{spec.steps}")
    timed = spec.steps - spec.warmup
    seconds = max(r["step_ends"][-1] - r["step_ends"][spec.warmup - 1] for r in ranks)
    return {"samples_per_s": timed * spec.batch_size * world / seconds,
            "first_step_s": max(r["step_ends"][0] - r["launched_at"] for r in ranks),
            "wall_s": wall_s, "peak_rss_bytes": [r["max_rss_bytes"] for r in ranks],
            "facts": {k: v for k, v in ranks[0].items()
                      if k not in ("rank", "step_ends", "launched_at", "max_rss_bytes")}}


# --- summaries -------------------------------------------------------------------------------------------
FIGURES = ("samples_per_s", "first_step_s", "wall_s", "peak_rss_mb")


def per_run(run: Result) -> dict[str, float]:
    return {"samples_per_s": run["samples_per_s"], "first_step_s": run["first_step_s"],
            "wall_s": run["wall_s"], "peak_rss_mb": max(run["peak_rss_bytes"]) / 2**20}


def summarize(model: str, runs: dict[str, list[Result]]) -> Result:
    """Per peer, each figure's mean with its interval over rounds; per hvdazure variant, its per-round ratios
    to every other peer (median, interval); the targets against the fastest and the slowest peer."""
    figures = {name: {key: [per_run(r)[key] for r in rs] for key in FIGURES} for name, rs in runs.items()}
    peers = {name: {key: stats.summary(values) for key, values in f.items()} for name, f in figures.items()}
    others = [name for name in runs if not is_hvdazure(name)]
    ratios: dict[str, dict[str, Result]] = {}
    for ours in filter(is_hvdazure, runs):
        ratios[ours] = {}
        for other in others:
            ratios[ours][other] = {key: _ratio(figures[ours][key], figures[other][key]) for key in FIGURES}
    target = TARGETS[regime(model)]
    verdicts: dict[str, Result] = {}
    if others:
        fastest = max(others, key=lambda n: peers[n]["samples_per_s"]["mean"])
        slowest_start = max(others, key=lambda n: peers[n]["first_step_s"]["mean"])
        for ours, theirs in ratios.items():
            speed, start = theirs[fastest]["samples_per_s"], theirs[slowest_start]["first_step_s"]
            verdicts[ours] = {
                "samples_per_s_vs_fastest": {"peer": fastest, "target_at_least": target, **speed,
                                             "verdict": stats.at_least_verdict(tuple(speed["ci95"]), target)},
                "first_step_vs_slowest": {"peer": slowest_start, "target_at_most": 1.0, **start,
                                          "verdict": stats.verdict(tuple(start["ci95"]), 1.0)}}
    return {"regime": regime(model), "peers": peers, "ratios": ratios, "targets": verdicts}


def _ratio(ours: Sequence[float], theirs: Sequence[float]) -> Result:
    values = [a / b for a, b in zip(ours, theirs, strict=True)]
    low, high = stats.bootstrap_interval(values, np.median)
    return {"median": float(np.median(values)), "ci95": [low, high]}


class Peers(Benchmark):
    """Starts its own jobs, one launcher per peer and run: no ranks of its own to measure on."""

    name = "peers"

    def __init__(self, peers: Sequence[Peer] = PEERS) -> None:
        self.peers = peers  # the registry's: PEERS

    def check(self, options: Options) -> None:
        if options["np"] < 2:
            raise BenchError("peers compares data-parallel training: -np must be at least 2, got "
                             f"{options['np']}")
        if options["rounds"] is not None and options["rounds"] < 1:
            raise BenchError(f"--rounds must be at least 1, got {options['rounds']}")
        for model in chosen_models(options["model"]):
            if model not in MODELS:
                raise BenchError(f"peers: unknown --model {model!r}; choose from {', '.join(MODELS)}")
            for framework in chosen_frameworks(options["framework"]):
                reason = model_unavailable(model, framework)
                if reason is not None:
                    raise BenchError(reason)

    def run(self, options: Options, jobs: Jobs) -> Result:
        """Rounds of every available peer on every regime, the peers' order rotated per round. A peer other
        than hvdazure that fails is dropped from that regime with the reason (its earlier rounds too: the
        ratios stay paired); hvdazure failing ends the benchmark."""
        n, quick = options["np"], options["quick"]
        rounds = options["rounds"] or (1 if quick else DEFAULT_ROUNDS)
        threads, gpus = threads_per_rank(n), has_gpus()
        frameworks = chosen_frameworks(options["framework"])
        chosen = [p for p in self.peers if p.framework in frameworks]
        available = [p for p in chosen if p.missing() is None]
        skipped = [{"peer": p.name, "framework": p.framework, "reason": p.missing()}
                   for p in chosen if p.missing() is not None]
        failed: list[Result] = []
        runs: dict[str, dict[str, dict[str, list[Result]]]] = {
            m: {f: {p.name: [] for p in available if p.framework == f} for f in frameworks}
            for m in chosen_models(options["model"])}
        with tempfile.TemporaryDirectory(prefix="hvdazure-bench-peers-") as scratch:
            for round_ in range(rounds if available else 0):
                for model, by_framework in runs.items():
                    start = round_ % len(available)
                    for peer in available[start:] + available[:start]:
                        if peer.name not in by_framework[peer.framework]:  # failed in an earlier round
                            continue
                        progress(f"peers: round {round_ + 1}/{rounds}: {model}: {peer.framework}: "
                                 f"{peer.name}")
                        folder = Path(tempfile.mkdtemp(prefix=f"r{round_}-{model}-", dir=scratch))
                        spec = PeerSpec.for_model(model, quick, str(folder))
                        try:
                            run = run_peer(peer, spec, n, threads, jobs.timeout_s, gpus)
                        except BenchError as exc:
                            if peer.is_hvdazure:
                                raise
                            del by_framework[peer.framework][peer.name]
                            failed.append({"peer": peer.name, "framework": peer.framework, "model": model,
                                           "round": round_ + 1, "reason": str(exc)})
                            continue
                        by_framework[peer.framework][peer.name].append(run)
        return {
            "world_size": n, "threads_per_rank": threads, "gpus": gpus, "rounds": rounds,
            "steps": {m: {"warmup": s.warmup, "timed": s.steps - s.warmup, "batch_per_rank": s.batch_size}
                      for m in runs for s in [PeerSpec.for_model(m, quick, "")]},
            "skipped": skipped, "failed": failed,
            "results": {m: {f: {"runs": rs, "summary": summarize(m, rs)} for f, rs in by_f.items() if rs}
                        for m, by_f in runs.items()},
        }

    def table(self, result: Result) -> str:
        lines = [f"peers: {result['world_size']} processes, {result['threads_per_rank']} thread(s) each, "
                 f"{result['rounds']} round(s); mean (95% interval) over rounds"]
        for model, by_framework in result["results"].items():
            steps = result["steps"][model]
            for framework, r in by_framework.items():
                s = r["summary"]
                lines += ["", f"{model} ({s['regime']}), {framework}: batch {steps['batch_per_rank']} per "
                              f"rank, {steps['warmup']} warm-up + {steps['timed']} timed steps",
                          f"{'peer':<30}{'samples/s':>24}{'first step (s)':>22}{'wall (s)':>20}"
                          f"{'peak RSS/rank (MB)':>22}"]
                for name, p in s["peers"].items():
                    lines.append(f"{name:<30}" + "".join(
                        _cell(p[key], width, digits) for key, width, digits in
                        (("samples_per_s", 24, 0), ("first_step_s", 22, 1), ("wall_s", 20, 1),
                         ("peak_rss_mb", 22, 0))))
                for ours, t in s["targets"].items():
                    speed, start = t["samples_per_s_vs_fastest"], t["first_step_vs_slowest"]
                    lines.append(f"{ours}: samples/s / {speed['peer']} (fastest) {speed['median']:.2f} "
                                 f"({speed['ci95'][0]:.2f}-{speed['ci95'][1]:.2f}), target >= "
                                 f"{speed['target_at_least']}: {speed['verdict']}; first step / "
                                 f"{start['peer']} (slowest) {start['median']:.2f} ({start['ci95'][0]:.2f}-"
                                 f"{start['ci95'][1]:.2f}), target <= 1: {start['verdict']}")
        for s in result["skipped"]:
            lines.append(f"skipped: {s['peer']} ({s['framework']}): {s['reason']}")
        for f in result.get("failed", []):
            lines.append(f"failed, left out of {f['model']}: {f['peer']} ({f['framework']}), round "
                         f"{f['round']}: {f['reason']}")
        return "\n".join(lines)

    def plot(self, result: Result, path: Path) -> None:
        """Samples/s of every peer with its interval, one panel per regime and framework."""
        plt = pyplot()
        panels = [(m, f, r["summary"]) for m, by_f in result["results"].items() for f, r in by_f.items()]
        count = max(1, len(panels))
        fig, axes = plt.subplots(1, count, figsize=(5 * count, 4.5), squeeze=False)
        for ax, (model, framework, s) in zip(axes[0], panels, strict=False):
            names = list(s["peers"])
            means = [s["peers"][n]["samples_per_s"]["mean"] for n in names]
            lows = [m - s["peers"][n]["samples_per_s"]["ci95"][0] for m, n in zip(means, names, strict=True)]
            highs = [s["peers"][n]["samples_per_s"]["ci95"][1] - m for m, n in zip(means, names, strict=True)]
            colors = ["C0" if is_hvdazure(n) else "C7" for n in names]
            ax.bar(range(len(names)), means, yerr=[lows, highs], capsize=4, color=colors)
            ax.set_xticks(range(len(names)), names, rotation=25, ha="right")
            ax.set_title(f"{model} ({s['regime']}), {framework}")
            ax.set_ylabel("samples/s, all ranks")
        fig.suptitle(f"hvdazure bench peers: {result['world_size']} processes, {result['rounds']} round(s)")
        save_figure(fig, path)


def _cell(summary: Result, width: int, digits: int) -> str:
    low, high = summary["ci95"]
    text = f"{summary['mean']:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"
    return f"{text:>{width}}"


if __name__ == "__main__":
    from hvdazure.bench.runner import main

    sys.exit(main("peers"))
