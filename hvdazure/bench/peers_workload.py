"""What every peer of `hvdazure bench peers` trains and reports, without a framework: the run's spec (read
by each peer's script from the JSON file named on its command line), the clock of its steps and the
per-rank result it writes. The peers' scripts (peer_scripts/) call only this and their own framework, so
each is what a user of that framework would write, plus one `clock.step_done()` per optimizer step.
"""

from __future__ import annotations

import json
import os
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hvdazure.bench.models import LR, MODELS
from hvdazure.core.callbacks import Callback
from hvdazure.core.config import TrainConfig

LAUNCHED_AT = "HVDAZURE_BENCH_LAUNCHED_AT"  # time.time() when the launcher was started (set by peers.py)
STEPS = {"mlp": (30, 150), "cnn": (5, 40), "resnet50": (5, 20)}  # warm-up steps, timed steps
QUICK_STEPS = (2, 4)


@dataclass(frozen=True)
class PeerSpec:
    """One run of one peer: the model, the batch per rank, the steps (the first `warmup` are not timed) and
    the folder each rank writes its result to."""

    model: str
    batch_size: int
    warmup: int
    steps: int
    out_dir: str

    @classmethod
    def for_model(cls, model: str, quick: bool, out_dir: str) -> PeerSpec:
        warmup, timed = QUICK_STEPS if quick else STEPS[model]
        return cls(model, MODELS[model].batch, warmup, warmup + timed, out_dir)

    def samples(self, world_size: int) -> int:
        """The training data's length: exactly `steps` optimizer steps in one epoch."""
        return self.steps * self.batch_size * world_size

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def read(cls, path: str | Path) -> PeerSpec:
        return cls(**json.loads(Path(path).read_text()))


def rank_threads() -> int:
    """The threads each rank computes with: OMP_NUM_THREADS, which peers.py sets alike for every peer."""
    return int(os.environ.get("OMP_NUM_THREADS", "1"))


class StepClock:
    """The wall-clock time (time.time(), comparable with the launch time across processes) at which each
    optimizer step ended on this rank; `synchronize` (if given) waits for the device first."""

    def __init__(self, synchronize: Any = None) -> None:
        self.synchronize = synchronize
        self.ends: list[float] = []

    def step_done(self) -> None:
        if self.synchronize is not None:
            self.synchronize()
        self.ends.append(time.time())

    def write(self, spec: PeerSpec, rank: int, world_size: int, **facts: Any) -> None:
        """This rank's result, `rank{rank}.json` in the spec's folder: its step end times, peak RSS and
        world size (and any facts the peer adds, such as the backend it ran on)."""
        result = {"rank": rank, "world_size": world_size, "step_ends": self.ends,
                  "launched_at": float(os.environ.get(LAUNCHED_AT, "nan")),
                  "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "threads": rank_threads(), **facts}
        Path(spec.out_dir, f"rank{rank}.json").write_text(json.dumps(result))


class StepEnds(Callback):
    """An hvdazure trainer's callback that tells a StepClock each optimizer step's end."""

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock

    def on_step_end(self, trainer: Any) -> None:
        self.clock.step_done()


def fit_hvdazure(trainer_class: Any, spec: PeerSpec, world_size: int, clock: StepClock) -> None:
    """Train `spec` through one of hvdazure's trainers (throughput_torch's or throughput_tf's
    SyntheticTrainer) with the clock, and write this rank's result with the controller it ran on."""
    # lr_scaling none: the same SGD step as the other peers' (a speed benchmark; hvdazure scales by default)
    config = TrainConfig(epochs=1, batch_size=spec.batch_size, lr=LR, lr_scaling="none", progress_bar=False)
    trainer = trainer_class(config, spec.model, spec.samples(world_size), StepEnds(clock))
    trainer.fit()
    clock.write(spec, trainer.rank, trainer.world_size, controller=trainer.collectives.controller)
