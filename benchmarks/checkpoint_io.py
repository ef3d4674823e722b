"""Checkpoint cost: hvdazure's atomic, verified save/load of a ~100 MB model against bare torch.save/load,
and the step-time stall a periodic checkpoint causes in training.

    .venv/bin/hvdazure run -np 2 benchmarks/checkpoint_io.py [--mb 100] [--repeats 5]

Part 1 runs on rank 0 alone (as saving does): the same state (model + optimizer) written by
CheckpointManager (temporary directory, sha256 while writing, fsync, rename, `latest`) and by a bare
torch.save to one file, with and without an fsync; then read back (hvdazure verifies every checksum).
Part 2 measures rank 0's peak memory on resume: fresh single-process trainers, built without a resume
(the baseline: model and optimizer in memory) and with one (read, verify, load), each reporting its peak
RSS (ru_maxrss), alternated; the difference is what a resume adds to the peak.
Part 3 trains on all ranks with a checkpoint every few steps and compares those steps with the others.
Rank 0 prints tables and writes JSON. Targets: save ratio <= 1.2 against bare torch.save.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import horovod.torch as hvd
import torch
from common import StepClock, write_result
from torch.utils.data import TensorDataset

from hvdazure import TrainConfig
from hvdazure.core.checkpoint import CheckpointManager
from hvdazure.torch import TorchTrainer


def big_model(mb: int) -> torch.nn.Module:
    side = int((mb * 2**20 / 4) ** 0.5)
    return torch.nn.Linear(side, side, bias=False)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def save_load(mb: int, repeats: int, root: Path) -> dict[str, list[float]]:
    model = big_model(mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    manager = CheckpointManager(str(root / "managed"), keep_last=1)
    bare = root / "bare.pt"
    writers = {"model.pt": lambda f: torch.save(model.state_dict(), f),
               "optimizer.pt": lambda f: torch.save(optimizer.state_dict(), f)}

    def bare_save(fsync: bool) -> None:
        with open(bare, "wb") as f:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())

    def managed_load() -> None:
        with manager.open_latest_valid() as (_, paths, _):  # as a resume: each file hashed, then loaded
            torch.load(paths["model.pt"], weights_only=True)
            torch.load(paths["optimizer.pt"], weights_only=True)

    times: dict[str, list[float]] = {k: [] for k in ("bare save", "bare save + fsync", "hvdazure save",
                                                     "bare load", "hvdazure load")}
    for step in range(repeats):  # interleaved, so noise hits all variants alike
        times["bare save"].append(timed(lambda: bare_save(False)))
        times["bare save + fsync"].append(timed(lambda: bare_save(True)))
        times["hvdazure save"].append(timed(lambda s=step: manager.save(s, writers, {})))
        times["bare load"].append(timed(lambda: torch.load(bare, weights_only=True)))
        times["hvdazure load"].append(timed(managed_load))
    return times


class StallTrainer(TorchTrainer):
    def build_model(self):
        return big_model(self.config.extra["mb"])

    def build_optimizer(self, params, lr):
        return torch.optim.SGD(params, lr=lr)

    def train_dataset(self):
        side = big_model(self.config.extra["mb"]).in_features
        return TensorDataset(torch.randn(64 * 40, side))

    def training_step(self, model, batch):
        (x,) = batch
        return model(x).pow(2).mean()


class ResumeProbe(StallTrainer):
    """The benchmark model with a handful of samples, so that the dataset does not blur the memory figures."""

    def train_dataset(self):
        return TensorDataset(torch.randn(8, big_model(self.config.extra["mb"]).in_features))


def probe(mode: str, mb: int, directory: Path) -> None:
    """In a fresh process (size 1): "save" writes one checkpoint to `directory`; "baseline" builds the
    trainer; "resume" builds it and resumes from `directory`. Prints this process's peak RSS in bytes."""
    config = TrainConfig(batch_size=8, lr=1e-6, progress_bar=False, checkpoint_dir=str(directory),
                         resume="auto" if mode == "resume" else None, extra={"mb": mb})
    trainer = ResumeProbe(config)
    trainer._prepare()  # what fit() does before the first step: build, broadcast, and resume if asked
    if mode == "save":
        trainer.save_checkpoint("benchmark")
    print(json.dumps({"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def _run_probe(mode: str, mb: int, directory: Path) -> int:
    # a fresh process outside this job: no launcher variables, or it would try to join the job's ranks
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMI", "PMIX_"))}
    proc = subprocess.run([sys.executable, __file__, "--probe", mode, "--mb", str(mb), "--probe-dir",
                           str(directory)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the {mode} probe exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_rss"]


def resume_memory(mb: int, repeats: int, root: Path) -> dict[str, list[float]]:
    """Peak RSS (MB) of fresh processes that build the trainer, with and without a resume, alternated."""
    directory = root / "resume"
    _run_probe("save", mb, directory)
    peaks: dict[str, list[float]] = {"baseline (model built)": [], "resume": []}
    for _ in range(repeats):
        peaks["baseline (model built)"].append(_run_probe("baseline", mb, directory) / 2**20)
        peaks["resume"].append(_run_probe("resume", mb, directory) / 2**20)
    return peaks


def stall(mb: int, every: int, root: Path) -> dict[str, float]:
    timer = StepClock()
    config = TrainConfig(epochs=1, batch_size=32, lr=1e-6, progress_bar=False, log_every=1000,
                         checkpoint_dir=str(root / "stall"), checkpoint_every_steps=every,
                         checkpoint_every_epochs=None, keep_last=1, extra={"mb": mb})
    trainer = StallTrainer(config, callbacks=[timer])
    trainer.fit()
    saving = [d for i, d in enumerate(timer.durations, 1) if i % every == 0]
    plain = [d for i, d in enumerate(timer.durations, 1) if i % every != 0]
    return {"steps": len(timer.durations), "every_steps": every,
            "median_step_s": statistics.median(plain), "median_checkpoint_step_s": statistics.median(saving),
            "stall_s": statistics.median(saving) - statistics.median(plain)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "checkpoint_io.json")
    parser.add_argument("--probe", choices=["save", "baseline", "resume"], help=argparse.SUPPRESS)
    parser.add_argument("--probe-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe(args.probe, args.mb, args.probe_dir)
        return 0
    hvd.init()
    with tempfile.TemporaryDirectory(dir=os.environ.get("HVDAZURE_BENCH_DIR")) as tmp:
        result: dict = {"benchmark": "checkpoint_io", "model_mb": args.mb, "world_size": hvd.size()}
        if hvd.rank() == 0:
            times = save_load(args.mb, args.repeats, Path(tmp))
            medians = {k: statistics.median(v) for k, v in times.items()}
            result.update(raw_s=times, median_s=medians,
                          save_ratio=medians["hvdazure save"] / medians["bare save"],
                          save_ratio_vs_fsync=medians["hvdazure save"] / medians["bare save + fsync"],
                          load_ratio=medians["hvdazure load"] / medians["bare load"])
            peaks = resume_memory(args.mb, args.repeats, Path(tmp))
            added = [r - b for b, r in zip(peaks["baseline (model built)"], peaks["resume"], strict=True)]
            result.update(resume_peak_rss_mb=peaks, resume_added_peak_mb=added)
        shared = Path(tmp) if hvd.rank() == 0 else Path(tempfile.mkdtemp())
        result["stall"] = stall(args.mb, args.every, shared)
    if hvd.rank() == 0:
        print(f"{'operation (' + str(args.mb) + ' MB model)':<28}{'median s':>10}")
        for name, value in result["median_s"].items():
            print(f"{name:<28}{value:>10.3f}")
        print(f"save ratio hvdazure / bare torch.save: {result['save_ratio']:.2f} (target <= 1.2); "
              f"against torch.save + fsync: {result['save_ratio_vs_fsync']:.2f}")
        print(f"load ratio hvdazure / bare torch.load: {result['load_ratio']:.2f}")
        for name, values in result["resume_peak_rss_mb"].items():
            print(f"peak RSS, {name:<22} median {statistics.median(values):7.0f} MB "
                  f"(min {min(values):.0f}, max {max(values):.0f})")
        added = result["resume_added_peak_mb"]
        print(f"resume adds to rank 0's peak: median {statistics.median(added):.0f} MB "
              f"(min {min(added):.0f}, max {max(added):.0f}) for a {args.mb} MB model")
        s = result["stall"]
        print(f"training, {hvd.size()} ranks, checkpoint every {s['every_steps']} steps: step "
              f"{s['median_step_s'] * 1e3:.1f} ms, checkpoint step "
              f"{s['median_checkpoint_step_s'] * 1e3:.1f} ms, stall {s['stall_s'] * 1e3:.1f} ms")
        write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
