"""The PyTorch side of the checkpoint benchmark: save/load against bare torch.save/load on rank 0, training
blocks with and without checkpoints on every rank, and the memory probes (fresh processes). Imported in
ranks and probes only.
"""

from __future__ import annotations

import itertools
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
from hvdazure.bench.checkpoint_workload import BATCH_SIZE, PROBES
from hvdazure.core.checkpoint.store import CheckpointManager
from hvdazure.core.trainer import loop_of
from hvdazure.torch import TorchTrainer
from hvdazure.torch.checkpoint_content import TorchCheckpointContent


def big_model(mb: int) -> torch.nn.Linear:
    """One square linear layer of about `mb` MB (its state is the checkpoint)."""
    side = int((mb * 2**20 / 4) ** 0.5)
    return torch.nn.Linear(side, side, bias=False)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def save_load(mb: int, repeats: int, root: Path) -> dict[str, list[float]]:
    """The same state (model + optimizer) saved and loaded the trainer's way and by hand, seconds per
    variant and repeat, the variants' order rotated from one repeat to the next, after one unrecorded round:

    - "hvdazure save": what a blocking checkpoint does with the model and optimizer (files of a
      TorchCheckpointContent through CheckpointManager: temporary folder, hashed while written, fsync,
      rename, `latest`), timed to
      the moment the checkpoint is durable and `latest` names it: what training waits for. Retention (the
      deletion of the checkpoint it replaces) follows, overlapped with training in a trainer; here it runs
      before the next variant, and "hvdazure save + retention" records the whole; "hvdazure save, CPU
      time" is the process's CPU time (user and system) until durable: what a background write takes from
      cores that training uses;
    - "torch.save + fsync" and "torch.save": one file with both state dicts, durable or not;
    - "write + fsync": as many bytes as the hand-saved file, written and fsynced: the disk's floor;
    - "async copy": what an async checkpoint does before training goes on (the copy of model and optimizer
      into the staging buffers): the floor of its stall;
    - "hvdazure load": what a resume does (the newest valid checkpoint, every file verified, loaded into
      the model and optimizer) against "torch.load": the hand-saved file loaded into them.
    """
    model = big_model(mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TorchCheckpointContent(model, optimizer, None, torch.device("cpu"))
    manager = CheckpointManager(str(root / "managed"), keep_last=1)
    bare, floor_file = root / "bare.pt", root / "floor.bin"
    step = itertools.count(1)

    def bare_save(fsync: bool) -> None:
        with open(bare, "wb") as f:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, f)
            if fsync:
                f.flush()
                os.fsync(f.fileno())

    def floor() -> None:
        with open(floor_file, "wb") as f:
            f.write(floor_bytes)
            f.flush()
            os.fsync(f.fileno())

    def bare_load() -> None:
        loaded = torch.load(bare, weights_only=True)
        model.load_state_dict(loaded["model"])
        optimizer.load_state_dict(loaded["optimizer"])

    def managed_load() -> None:
        with manager.open_latest_valid() as (_, paths, _):
            state.load_files(paths)

    def managed_save() -> None:  # as a blocking checkpoint: the files written from the live state
        start, cpu = time.perf_counter(), time.process_time()

        def done(_: Any) -> None:
            durable.append(time.perf_counter() - start)
            busy.append(time.process_time() - cpu)

        manager.save(next(step), state.save_files(copy=False), {}, on_durable=done)

    variants = {"torch.save": lambda: bare_save(False), "torch.save + fsync": lambda: bare_save(True),
                "write + fsync": floor, "hvdazure save": managed_save,
                "async copy": lambda: state.save_files(copy=True), "torch.load": bare_load,
                "hvdazure load": managed_load}
    bare_save(False)
    floor_bytes = bare.read_bytes()
    times: dict[str, list[float]] = {name: [] for name in variants}
    durable: list[float] = []
    busy: list[float] = []
    names = list(variants)
    for repeat in range(-1, repeats):  # round -1 warms up in this order (first allocations, files in place)
        shift = max(repeat, 0) % len(names)
        for name in names[shift:] + names[:shift]:
            seconds = timed(variants[name])
            if repeat >= 0:
                times[name].append(seconds)
    times["hvdazure save + retention"] = times["hvdazure save"]
    times["hvdazure save"] = durable[1:]  # the warm-up round's left out
    times["hvdazure save, CPU time"] = busy[1:]  # what a background write takes from training's cores
    return times


def store_save_load(url: str, mb: int, repeats: int) -> dict[str, list[float]]:
    """The same state saved and loaded the trainer's way to and from the store at `url` (a folder of its
    own under it, deleted afterwards), against the store's floor: as many bytes written and read back with
    fsspec, in the same run, the variants' order rotated after one unrecorded round:

    - "hvdazure save": a blocking checkpoint's save until `latest` names it (every file uploaded, hashed
      while written, the manifest, then `latest`); "hvdazure save + retention" with the deletion of the
      checkpoint it replaces;
    - "write (fsspec)": the bytes of torch.save of the same state, one fs.pipe_file: the store's floor;
    - "hvdazure load": a resume's load (the newest valid checkpoint, every byte verified, loaded into the
      model and optimizer);
    - "read (fsspec)": the same bytes back with one fs.cat_file.
    """
    import io
    import uuid

    import fsspec

    model = big_model(mb)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TorchCheckpointContent(model, optimizer, None, torch.device("cpu"))
    root = f"{url.rstrip('/')}/hvdazure-bench-{uuid.uuid4().hex[:12]}"
    manager = CheckpointManager(f"{root}/managed", keep_last=1)
    fs, folder = fsspec.core.url_to_fs(root)
    floor_path = f"{folder}/floor.bin"
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    floor_bytes = buffer.getvalue()
    step = itertools.count(1)
    durable: list[float] = []

    def managed_save() -> None:
        start = time.perf_counter()
        manager.save(next(step), state.save_files(copy=False), {},
                     on_durable=lambda _: durable.append(time.perf_counter() - start))

    def managed_load() -> None:
        with manager.open_latest_valid() as (_, paths, _):
            state.load_files(paths)

    variants = {"write (fsspec)": lambda: fs.pipe_file(floor_path, floor_bytes),
                "hvdazure save": managed_save, "read (fsspec)": lambda: fs.cat_file(floor_path),
                "hvdazure load": managed_load}
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    try:
        for repeat in range(-1, repeats):
            shift = max(repeat, 0) % len(names)
            for name in names[shift:] + names[:shift]:
                seconds = timed(variants[name])
                if repeat >= 0:
                    times[name].append(seconds)
    finally:
        fs.rm(folder, recursive=True)
    times["hvdazure save + retention"] = times["hvdazure save"]
    times["hvdazure save"] = durable[1:]
    return times


def measure_store(url: str, mb: int, repeats: int) -> dict | None:
    """Rank 0 times save and load on the store at `url` while the others wait; rank 0's figures."""
    hvd.init()
    times = store_save_load(url, mb, repeats) if hvd.rank() == 0 else None
    hvd.barrier()
    return {"world_size": hvd.size(), "url": url, "save_load_s": times} if hvd.rank() == 0 else None


class BlockClock(Callback):
    """Each step's time in a block, from the end of the step before (a periodic checkpoint included in its
    step's), after the first step and up to the last (the trainer's final checkpoint, blocking in every
    mode, comes after it); the last periodic checkpoint leaves steps enough for a background write to end
    within the block."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.durations: list[float] = []
        self.mark = 0.0  # the end of the step before: read from the second step on

    def on_step_end(self, trainer: Any) -> None:
        now = time.perf_counter()
        if 1 < trainer.state.step <= self.steps:
            self.durations.append(now - self.mark)
        self.mark = now


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


def training_block(mb: int, steps: int, every: int, saving: str, directory: Path) -> list[float]:
    """`steps` training steps; `saving`: "none", "async" (background write after an in-memory copy) or
    "blocking" (checkpoint_async: false), a checkpoint every `every` steps. The seconds of each step after
    the first (BlockClock)."""
    config = TrainConfig(epochs=1, batch_size=BATCH_SIZE, lr=1e-6, progress_bar=False, log_every=1000,
                         checkpoint_dir=None if saving == "none" else str(directory),
                         checkpoint_every_steps=every, checkpoint_every_epochs=None, keep_last=1,
                         checkpoint_async=saving == "async",
                         extra={"mb": mb, "samples": steps * BATCH_SIZE * hvd.size()})
    clock = BlockClock(steps)
    StallTrainer(config, callbacks=[clock]).fit()
    return clock.durations


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
        blocks: dict[str, list[list[float]]] = {"none": [], "async": [], "blocking": []}
        order = list(blocks)
        for pair in range(pairs):
            for saving in order[pair % 3:] + order[:pair % 3]:
                durations = training_block(mb, steps, every, saving, root / f"{saving}{pair}")
                slowest = hvd.allreduce(torch.tensor(durations, dtype=torch.float64), op=hvd.Max,
                                        name="bench.block")  # ranks step together: the slowest's time
                blocks[saving].append(slowest.tolist())
            if hvd.rank() == 0:
                progress(f"checkpoint: training round {pair + 1}/{pairs}")
    if hvd.rank() != 0:
        return None
    return {"world_size": hvd.size(), "save_load_s": times, "step_s": blocks}


class MemoryProbe(StallTrainer):
    """The benchmark model with a handful of samples, so that the data do not blur the memory figures."""

    def train_dataset(self) -> TensorDataset:
        return TensorDataset(torch.randn(8, big_model(self.config.extra["mb"]).in_features))


def probe(mode: str, mb: int, directory: str) -> None:
    """In a fresh single-rank process: build the trainer (as fit() does before its first step), then
    "prepare": save one checkpoint into `directory` for the resumes; "baseline": nothing more; "async save"
    / "blocking save": save a checkpoint and wait for it; "resume": build it resuming from `directory`.
    Prints this process's peak RSS and the size of the newest checkpoint in `directory`, in bytes. The
    probes that start a run of their own save into a new folder inside `directory` (a directory holds one
    run's checkpoints)."""
    if mode not in ("prepare", *PROBES):
        raise SystemExit(f"unknown probe {mode!r}")
    own = directory if mode in ("prepare", "resume") else tempfile.mkdtemp(prefix=f"{mode}-", dir=directory)
    config = TrainConfig(batch_size=8, lr=1e-6, progress_bar=False, checkpoint_dir=own, keep_last=1,
                         checkpoint_async=mode == "async save", resume="auto" if mode == "resume" else None,
                         extra={"mb": mb, "samples": 8})
    trainer = MemoryProbe(config)
    loop = loop_of(trainer)
    loop.prepare()  # what fit() does before the first step: build, broadcast, and resume if asked
    if mode in ("prepare", "async save", "blocking save"):
        trainer.save_checkpoint("benchmark", wait=mode != "async save")
        assert loop.checkpoints is not None  # checkpoint_dir is set
        loop.checkpoints.finish_pending()
    newest = CheckpointManager(directory).checkpoints()[-1]
    print(json.dumps({"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "checkpoint_bytes": sum(f["bytes"] for f in newest.manifest["files"].values())}))


if __name__ == "__main__":  # a probe: python -m hvdazure.bench.checkpoint_torch MODE MB DIRECTORY
    probe(sys.argv[1], int(sys.argv[2]), sys.argv[3])
