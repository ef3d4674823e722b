"""What a framework binding gives the core Trainer: one `Backend` object, its only way to the framework.

As Horovod puts a thin adapter per framework over one core (horovod/torch/mpi_ops.py), a binding here is a
`Backend` (hvdazure.torch's TorchBackend, hvdazure.tensorflow's TensorFlowBackend) that the core Trainer
holds, and two small interfaces it hands out:

- `Collectives`: talking to other ranks. The same verbs for every Horovod binding; only the tensor types
  differ. The loop reduces metrics with them, the checkpoint code shares outcomes and RNG states.
- `FrameworkCheckpointContent`: what a checkpoint holds of the framework (model and optimizer files, extra
  JSON state such as a loss scaler, RNG streams), as save/load pairs. The checkpoint code is its only user.

The user's class (TorchTrainer, TensorFlowTrainer) keeps the user's hooks (build_model, training_step, ...)
and only creates its backend, which calls them through `UserHooks` (a binding's protocol adds its own
build_optimizer): no binding's backend imports its trainer. What the backend needs of the run (the
communicator, the config, the step clock) the loop gives it when it starts it, not through the user's object.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

from hvdazure.core.config import ControllerError, TrainConfig
from hvdazure.core.errors import UserError
from hvdazure.core.metrics import MetricAccumulator
from hvdazure.core.nonfinite import NO_RECORD
from hvdazure.core.predictions import PredictionWriter
from hvdazure.core.profiling import StepProfiler
from hvdazure.core.sample_plan import MicroBatch, SampleOrder
from hvdazure.core.step_batches import StepCursor
from hvdazure.core.step_times import StepTimes, no_device


class DataError(UserError, ValueError):
    """The training or evaluation data cannot be used as given; the message says what to use instead
    (shown as one line when it ends the script, as a ConfigError is)."""


class Collectives(ABC):
    """Collectives over all ranks of the job; every rank calls each one at the same point. `controller`:
    what Horovod coordinates the ranks with ("gloo" or "mpi"; see `horovod_controller`)."""

    def __init__(self, rank: int, size: int, local_rank: int, controller: str = "none") -> None:
        self.rank, self.size, self.local_rank = rank, size, local_rank
        self.controller = controller

    @abstractmethod
    def allgather_floats(self, values: Sequence[Any]) -> list[list[float]]:
        """Every rank's `values` (floats or framework scalars; the lengths may differ), as float64, on
        every rank, in rank order; one collective."""

    @abstractmethod
    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's `data` (None elsewhere), on every rank."""

    @abstractmethod
    def allgather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's `data`, in rank order, on every rank."""


def horovod_controller(hvd: Any) -> str:
    """The controller a started Horovod runs on, asked of Horovod itself: "gloo" or "mpi". `hvd` is the
    binding's Horovod module (horovod.torch, horovod.tensorflow: both answer the same question)."""
    return "gloo" if hvd.gloo_enabled() else "mpi"


def refuse_adasum_without_mpi(reduce_op: str, controller: str) -> None:
    """A ControllerError for `reduce_op` 'adasum' on a controller other than MPI: Horovod has Adasum only
    under MPI, and under Gloo every rank would die at its first step (`No Adasum operation enabled`)."""
    if reduce_op == "adasum" and controller != "mpi":
        raise ControllerError(f"config field 'reduce_op': 'adasum' needs the MPI controller, but Horovod "
                              f"runs on {controller}; run with `hvdazure run --mpi` (or `horovodrun "
                              f"--mpi`), or use reduce_op 'average'")


def split_rows(joined: Sequence[float]) -> list[list[float]]:
    """The rows of an allgather of rows each sent with its length in front (so rows of any lengths travel
    in one collective), in rank order."""
    rows, at = [], 0
    while at < len(joined):
        length = int(joined[at])
        rows.append([float(v) for v in joined[at + 1 : at + 1 + length]])
        at += 1 + length
    return rows


class FrameworkCheckpointContent(ABC):
    """What a checkpoint holds of one rank's framework: model and optimizer files, extra state, RNGs.

    `state_dict` / `load_state_dict` are the extra JSON state, so that this object is one of the named
    stateful pieces a trainer's checkpoint saves (core/checkpoint/trainer_checkpoints.py)."""

    @abstractmethod
    def save_files(self, copy: bool) -> dict[str, Callable[[BinaryIO], None]]:
        """Writers of the tensor files of a checkpoint (model, optimizer), called on rank 0. With `copy`,
        the state is copied when this is called: training goes on while a background thread writes the
        files. Without, the writers read the live state: the caller trains no further until they are done
        (a blocking save needs no copy, in time or memory)."""

    def collect(self) -> None:
        """Called on every rank together before rank 0 takes a checkpoint's files: state spread over the
        ranks (a sharded optimizer's) is brought to rank 0 here, a slice at a time. Nothing by default."""
        return None

    def manifest_record(self) -> dict[str, Any]:
        """What a checkpoint's manifest says of how the optimizer's state is laid out over the ranks (a
        sharded optimizer's partition: its stage, ranks and buckets), JSON-ready; empty (nothing recorded)
        when every rank holds all of it."""
        return {}

    @abstractmethod
    def load_files(self, paths: dict[str, str]) -> None:
        """Load the tensor files of a checkpoint into model and optimizer, on rank 0. `paths` maps each file
        of the checkpoint (those save_files wrote among them) to a local file already verified against
        the manifest; the files last only for the call. Raise on a state the model cannot take."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """JSON-ready framework state beyond model and optimizer (e.g. the AMP loss scaler)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict returned."""

    @abstractmethod
    def save_rng(self) -> dict[str, Any]:
        """This rank's framework RNG states, JSON-ready (Python's and NumPy's are the core's)."""

    @abstractmethod
    def load_rng(self, state: dict[str, Any]) -> None:
        """Restore what save_rng returned, on the same rank."""

    @abstractmethod
    def seed(self, seed: int) -> None:
        """Seed the framework's RNGs on this rank (Python's and NumPy's are the core's)."""

    def nonfinite_weight(self) -> str | None:
        """The name of a model weight holding NaN or infinite values, or None when all are finite: rank 0
        writes no checkpoint of such weights (core/nonfinite.py). One reduction over the weights."""
        return None


@dataclass(frozen=True)
class RankStep:
    """This rank's part of one optimizer step: its micro-batches, their batches (loaded as they are
    iterated, in order; None for an empty micro-batch, which gets no forward pass unless the model has
    synchronized BatchNorm layers: then one on a batch of no samples) and each one's loss weight (its
    share of the step's samples, see MicroBatch.loss_weight)."""

    micro_batches: list[MicroBatch]
    batches: Iterator[Any]
    loss_weights: list[float]
    number: int = 0  # the optimizer step this is, counted from 1 over the run (state.step after it)

    def __iter__(self) -> Iterator[tuple[MicroBatch, Any, float]]:
        return zip(self.micro_batches, self.batches, self.loss_weights, strict=True)


class UserHooks(Protocol):
    """The user's hooks a binding's backend calls, framework-free (the models, batches and datasets are the
    framework's: Any here). The user's class (TorchTrainer, TensorFlowTrainer) fills it; each binding's
    protocol adds build_optimizer, whose arguments differ (torch/backend.py's TorchHooks,
    tensorflow/backend.py's KerasHooks). The backend holds the user's object as this and nothing more."""

    def build_model(self) -> Any: ...

    def train_dataset(self) -> Any: ...

    def eval_dataset(self) -> Any: ...

    def training_step(self, model: Any, batch: Any) -> Any: ...

    def validation_step(self, model: Any, batch: Any) -> Any: ...

    def predict_step(self, model: Any, batch: Any) -> Any: ...


class Backend(ABC):
    """A framework's operations, in the order the Trainer calls them: start, load_datasets, build,
    broadcast_model_and_optimizer, then run_step / evaluate / set_lr per step, and shutdown."""

    framework_name = "none"  # recorded in checkpoints: a resume refuses another framework's
    micro_batch: MicroBatch | None = None  # the one being trained on (training_step may read it)
    # The loop's clock of the step's phases (core/step_times.py), given by start(): run_step charges its
    # compute, exchange and optimizer time (or one compiled step's) to it; the loop times the data wait.
    clock: StepTimes
    # The job's devices in one line, set by start() (core/devices.py's Placement.layout); rank 0 logs it.
    device_layout = ""
    _config: Callable[[], TrainConfig]  # given by start()

    @property
    def config(self) -> TrainConfig:
        """The run's config as it is now (start()'s `config` asked; a user may replace it between fit()
        and predict())."""
        return self._config()

    def start(self, comm: Any, config: Callable[[], TrainConfig], clock: StepTimes) -> Collectives:
        """Start Horovod on the mpi4py communicator `comm`'s ranks (None: all); return the collectives over
        its ranks. `config`: the run's config as it is when asked (read as `self.config`); `clock`: the step
        clock run_step charges its phases to (`self.clock`). Both are kept before the binding's _start."""
        self._config, self.clock = config, clock
        return self._start(comm)

    @abstractmethod
    def _start(self, comm: Any) -> Collectives:
        """The binding's start: Horovod on `comm`'s ranks (pin devices, share the cores), its collectives."""

    @abstractmethod
    def shutdown(self) -> None:
        """Shut Horovod down (a program running several trainings starts it afresh for each)."""

    @abstractmethod
    def load_datasets(self) -> SampleOrder:
        """Build the datasets; return the training data's order: `UniformOrder(len(data))` for data in
        memory or random-access (map-style), the dataset's own (a ShardOrder) for sharded data."""

    def data_fingerprint(self) -> str | None:
        """A hash of the training data a checkpoint records and a resume compares (a sharded dataset's
        index); None where there is none to check (data in memory)."""
        return None

    @abstractmethod
    def build(self, peak_lr: float) -> FrameworkCheckpointContent:
        """Build model and optimizer (with the scaled LR), the same initial weights on every rank; return
        what a checkpoint holds of them. The core seeds each rank's RNGs after this (core/seeds.py)."""

    @abstractmethod
    def broadcast_model_and_optimizer(self) -> None:
        """Make every rank's model and optimizer equal to rank 0's."""

    @abstractmethod
    def epoch_batches(self, steps: StepCursor) -> Iterator[Any]:
        """The batches of the micro-batches with samples of `steps`, in order, ready for the step (on the
        device). `steps` is a cursor over the core's one walk of this rank's plan, from the step being
        trained to the epoch's end (core/step_batches.py): the loader takes its steps from it as far ahead
        of the loop as it reads (`loaded_cells`), a sharded dataset the coming ones to fetch (`coming`);
        the backend never walks the plan itself."""

    @abstractmethod
    def run_step(self, step: RankStep, meter: MetricAccumulator, stop_vote: float | None) -> float:
        """Forward/backward over this rank's micro-batches, one optimizer step; add metrics to `meter`.

        `stop_vote` (1.0: this rank got a stop signal; None: no vote this run) is summed over ranks in the
        same step, without a blocking collective of its own (asynchronously, or inside the compiled step);
        return the sum (0.0 without a vote)."""

    @abstractmethod
    def evaluate(self, meter: MetricAccumulator, first_batch_only: bool = False, data: Any = None) -> bool:
        """Add this rank's evaluation metrics to `meter`; False if there is no evaluation dataset.

        `first_batch_only`: the sanity check before training (core/sample_plan.py's `first_eval_batch`),
        which must leave the model as it found it (train or eval mode); the core restores the RNG streams.
        `data`: an `inference_data` view to evaluate instead of the evaluation dataset (`test`)."""

    @abstractmethod
    def inference_data(self, dataset: Any, purpose: str) -> Any:
        """The binding's view (with `len`) of the user's `dataset` for `predict` or `test` (`purpose`)."""

    @abstractmethod
    def predict(self, data: Any, batches: list[range]) -> Iterator[Any]:
        """predict_step's output for each of `batches` (sample indices of the `inference_data` view `data`),
        as it returned it, in order; the model in inference mode (eval, no gradients) and left in the mode
        it had. The core checks and converts them (core/predictions.py)."""

    @abstractmethod
    def output_as_numpy(self, value: Any) -> Any:
        """One of predict_step's output tensors as a NumPy array, on the host."""

    @abstractmethod
    def prediction_writer(self, output: str) -> PredictionWriter:
        """Where `predict(output=...)` writes: shards of a ShardedDataset at `output` (path or URL)."""

    model_file = "model"  # the name of the model's file in a checkpoint (FrameworkCheckpointContent's)
    export_formats: tuple[str, ...] = ()  # what its trainer's export() writes, the default first

    @abstractmethod
    def load_model_file(self, path: str) -> None:
        """Load the model's weights from `path`, a checkpoint's `model_file` already verified; a ValueError
        saying what does not fit where the weights are not this model's."""

    @abstractmethod
    def set_lr(self, lr: float) -> None:
        """Set the optimizer's learning rate."""

    def metric_to_float64(self, value: Any) -> Any:
        """A metric value as float64, on its device (no synchronisation); see MetricAccumulator."""
        return float(value)

    def nonfinite_record(self) -> Sequence[Any]:
        """This rank's record of non-finite steps (core/nonfinite.py's RECORD: numbers or device scalars,
        read in the log interval's fused collective); a backend that keeps none reports NO_RECORD."""
        return NO_RECORD

    def min_samples_per_micro_batch(self) -> tuple[int, str, bool]:
        """The fewest samples a training micro-batch may hold, why (e.g. BatchNorm layers need 2), and
        whether that counts all ranks' samples of the micro-batch together (synchronized BatchNorm)."""
        return 1, "", False

    def framework_versions(self) -> dict[str, str]:
        """Versions recorded in each checkpoint's manifest, beside hvdazure's and Python's."""
        return {}

    def step_profiler(self) -> StepProfiler | None:
        """The framework's profiler, which the core starts and stops around the steps config field
        profile_steps names (core/profiling.py); None: this framework has none."""
        return None

    def device_stats(self) -> tuple[float, float, float]:
        """This rank's accelerator since the last call, for the step times: its peak memory allocated and
        reserved (bytes; the peaks are reset) and its utilization now (percent); NaN for what it cannot tell
        (CPUs: all three).
        Called once per log interval: cheap, and no synchronization with the device."""
        return no_device()
