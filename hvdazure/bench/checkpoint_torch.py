"""The PyTorch side of the checkpoint benchmark: save/load against bare torch.save/load on rank 0, training
blocks with and without checkpoints on every rank, and the resume-memory probe (a fresh process). Imported
in ranks and probes only.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import horovod.torch as hvd
import torch
from torch.utils.data import TensorDataset

from hvdazure import Callback, TrainConfig
from hvdazure.core.checkpoint import CheckpointManager
from hvdazure.torch import TorchTrainer

BATCH_SIZE = 32


def big_model(mb: int) -> torch.nn.Linear:
    """One square linear layer of about `mb` MB (its state is the checkpoint)."""
    side = int((mb * 2**20 / 4) ** 0.5)
    return torch.nn.Linear(side, side, bias=False)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def save_load(mb: int, repeats: int, root: Path) -> dict[str, list[float]]:
    """The same state (model + optimizer) through CheckpointManager (temporary folder, sha256 while writing,
    fsync, rename, `latest`; loading verifies every file first) and through one bare torch.save, with and
    without fsync; the variants alternate in every repeat. Seconds per variant and repeat."""
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

    variants = {"bare save": lambda: bare_save(False), "bare save + fsync": lambda: bare_save(True),
                "hvdazure save": None, "bare load": lambda: torch.load(bare, weights_only=True),
                "hvdazure load": managed_load}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for step in range(repeats):
        for name, fn in variants.items():
            times[name].append(timed(fn or (lambda s=step: manager.save(s, writers, {}))))
    return times


class FirstStepMark(Callback):
    """The time the first step ended: a block is timed from there to the end of fit() (a pending background
    write included)."""

    def on_step_end(self, trainer: Any) -> None:
        if trainer.state.step == 1:
            self.mark = time.perf_counter()


class StallTrainer(TorchTrainer):
    def build_model(self) -> torch.nn.Module:
        return big_model(self.config.extra["mb"])

    def build_optimizer(self, params: Any, lr: float) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=lr)

    def train_dataset(self) -> TensorDataset:
        side = big_model(self.config.extra["mb"]).in_features
        g = torch.Generator().manual_seed(0)
        return TensorDataset(torch.randn(self.config.extra["samples"], side, generator=g))

    def training_step(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        (x,) = batch
        return model(x).pow(2).mean()


def training_block(mb: int, steps: int, every: int, saving: str, directory: Path) -> float:
    """`steps` training steps; `saving`: "none", "async" (background write after an in-memory copy) or
    "blocking" (checkpoint_async: false), a checkpoint every `every` steps. Seconds after the first step."""
    config = TrainConfig(epochs=1, batch_size=BATCH_SIZE, lr=1e-6, progress_bar=False, log_every=1000,
                         checkpoint_dir=None if saving == "none" else str(directory),
                         checkpoint_every_steps=every, checkpoint_every_epochs=None, keep_last=1,
                         checkpoint_async=saving == "async",
                         extra={"mb": mb, "samples": steps * BATCH_SIZE * hvd.size()})
    mark = FirstStepMark()
    StallTrainer(config, callbacks=[mark]).fit()
    return time.perf_counter() - mark.mark


def measure_ranks(mb: int, repeats: int, pairs: int, steps: int, every: int,
                  progress: Callable[[str], None]) -> dict | None:
    """Rank 0 times save and load while the others wait; then every rank trains the blocks: per round, one
    without checkpoints, one with async and one with blocking saves, their order rotated. Rank 0's figures."""
    hvd.init()
    if "OMP_NUM_THREADS" not in os.environ:  # the trainer's own setting
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // hvd.local_size()))
    with tempfile.TemporaryDirectory(dir=os.environ.get("HVDAZURE_BENCH_DIR")) as folder:
        root = Path(folder)
        times = save_load(mb, repeats, root) if hvd.rank() == 0 else None
        hvd.barrier()
        if hvd.rank() == 0:
            progress("checkpoint: save and load done")
        blocks: dict[str, list[float]] = {"none": [], "async": [], "blocking": []}
        order = list(blocks)
        for pair in range(pairs):
            for saving in order[pair % 3:] + order[:pair % 3]:
                seconds = training_block(mb, steps, every, saving, root / f"{saving}{pair}")
                blocks[saving].append(float(hvd.allreduce(torch.tensor(seconds, dtype=torch.float64),
                                                          op=hvd.Max, name="bench.block")))
            if hvd.rank() == 0:
                progress(f"checkpoint: training round {pair + 1}/{pairs}")
    if hvd.rank() != 0:
        return None
    return {"world_size": hvd.size(), "save_load_s": times, "block_s": blocks}


class ResumeProbe(StallTrainer):
    """The benchmark model with a handful of samples, so that the data do not blur the memory figures."""

    def train_dataset(self) -> TensorDataset:
        return TensorDataset(torch.randn(8, big_model(self.config.extra["mb"]).in_features))


def probe(mode: str, mb: int, directory: str) -> None:
    """In a fresh single-rank process: "save" writes one checkpoint to `directory`; "baseline" builds the
    trainer; "resume" builds it and resumes from `directory`. Prints this process's peak RSS in bytes."""
    config = TrainConfig(batch_size=8, lr=1e-6, progress_bar=False, checkpoint_dir=directory,
                         resume="auto" if mode == "resume" else None, extra={"mb": mb, "samples": 8})
    trainer = ResumeProbe(config)
    trainer._prepare()  # what fit() does before the first step: build, broadcast, and resume if asked
    if mode == "save":
        trainer.save_checkpoint("benchmark")
    print(json.dumps({"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


if __name__ == "__main__":  # a probe: python -m hvdazure.bench.checkpoint_torch MODE MB DIRECTORY
    probe(sys.argv[1], int(sys.argv[2]), sys.argv[3])
