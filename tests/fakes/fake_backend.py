"""A test double of a framework *backend* (what hvdazure.torch's TorchBackend is): ranks as threads of one
process, no Horovod.

FakeBackend implements hvdazure.core.backend.Backend for a linear regression in NumPy (float64, exact SGD),
and FakeTrainer is the user's class on it (as TorchTrainer is on TorchBackend), so the real loop runs
unchanged on 1..N simulated ranks in milliseconds: `Trainer.fit`, the shard plan, LR schedule, metric
reduction, stop votes, callbacks, and the real checkpoint code writing real checkpoints. It stands in for a
backend, not for Horovod: its collectives only have to look, from the loop's side, like the real ones.

ThreadWorld runs one thread per rank. A collective is an exchange keyed by call order: each rank's n-th
collective meets the other ranks' n-th. What would hang or garble a real job fails the test at once, with
a message naming the ranks: different collectives (kind or name) at the same position, allreduces of
different lengths, a rank that finished while others wait for it, a wait longer than `timeout`. An
exception on one rank aborts the world (the other ranks' waits raise WorldAborted, as Horovod raises when
a peer is gone) and `ThreadWorld.run` re-raises it in the calling thread.

Signal handlers are installed only in the main thread (core/stop_signals.py): on rank threads they are
not, and `FakeTrainer.receive_signal` plays the handler's part.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np

from hvdazure.core.backend import Backend, Collectives, FrameworkCheckpointContent, RankStep
from hvdazure.core.callbacks import Callback
from hvdazure.core.config import TrainConfig
from hvdazure.core.metrics import MetricAccumulator
from hvdazure.core.profiling import ProfilerTrace, StepProfiler
from hvdazure.core.rank_logging import logger
from hvdazure.core.sample_plan import SampleOrder, UniformOrder, eval_range, first_eval_batch
from hvdazure.core.step_batches import StepCursor, loaded_cells
from hvdazure.core.step_times import no_device
from hvdazure.core.trainer import Trainer, loop_of
from hvdazure.data.prediction_output import PredictionShards

T = TypeVar("T")


class WorldError(RuntimeError):
    """The simulated job went wrong in a way that would hang or corrupt a real one."""


class CollectiveMismatch(WorldError):
    """Ranks entered different collectives at the same position, or one finished while others wait."""


class CollectiveTimeout(WorldError):
    """A rank waited longer than the world's timeout."""


class WorldAborted(WorldError):
    """Another rank failed; this rank's collective can never complete."""


@dataclass(frozen=True)
class _Call:
    kind: str
    name: str
    payload: Any

    def describe(self) -> str:
        shape = f" of shape {np.shape(self.payload)}" if self.kind.startswith("allreduce") else ""
        return f"{self.kind} {self.name!r}{shape}"


class ThreadWorld:
    """`size` ranks as threads of this process, and the collectives between them; one `run` per world.

    `timeout` bounds each wait in a collective; a whole run gets 3 x timeout + 5 s."""

    def __init__(self, size: int, timeout: float = 20.0) -> None:
        if size < 1:
            raise ValueError(f"a world needs at least 1 rank, got {size}")
        self.size, self.timeout = size, timeout
        self._cond = threading.Condition()
        self._slots: dict[int, list[_Call | None]] = {}  # collective number -> each rank's call
        self._reads: dict[int, int] = {}  # how many ranks have taken slot n's result
        self._calls = [0] * size  # collectives entered, per rank
        self._finished = [False] * size
        self._abort_cause: BaseException | None = None
        self._started = False

    @property
    def aborted(self) -> bool:
        return self._abort_cause is not None

    # --- running ranks ---------------------------------------------------------------------------------
    def run(self, rank_functions: Sequence[Callable[[], T]]) -> list[T]:
        """Call rank r's function in thread r; their results in rank order. The first exception of any rank
        is re-raised here (the others are released); SystemExit too, if every rank exited with one code."""
        if len(rank_functions) != self.size:
            raise ValueError(f"{len(rank_functions)} functions for {self.size} ranks")
        if self._started:
            raise RuntimeError("a ThreadWorld runs once: its collectives are numbered from its start")
        self._started = True
        results: list[Any] = [None] * self.size
        exits: list[SystemExit | None] = [None] * self.size
        failures: list[tuple[int, BaseException]] = []  # in the order they happened

        def main(rank: int) -> None:
            try:
                results[rank] = rank_functions[rank]()
            except SystemExit as exc:
                exits[rank] = exc
            except BaseException as exc:  # collected and re-raised by run(), in the calling thread
                if not isinstance(exc, WorldAborted):
                    with self._cond:
                        failures.append((rank, exc))
                self._abort(exc)
            finally:
                with self._cond:
                    self._finished[rank] = True
                    self._cond.notify_all()

        threads = [threading.Thread(target=main, args=(rank,), name=f"fake-rank-{rank}", daemon=True)
                   for rank in range(self.size)]
        with _logging_restored():
            for thread in threads:
                thread.start()
            self._join(threads)
        if failures:
            rank, exc = failures[0]
            exc.add_note(f"(raised on rank {rank} of a {self.size}-rank ThreadWorld)")
            raise exc
        if any(exits):
            codes = {exc.code if exc is not None else "returned" for exc in exits}
            if len(codes) > 1:
                raise WorldError(f"ranks ended differently: {[e.code if e else 'returned' for e in exits]}")
            raise exits[0]  # type: ignore[misc]
        return results

    def _join(self, threads: list[threading.Thread]) -> None:
        limit = 3 * self.timeout + 5
        deadline = time.monotonic() + limit
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t for t in threads if t.is_alive()]
        if not stuck:
            return
        frames = sys._current_frames()
        stacks = "\n".join(f"{t.name}:\n{''.join(traceback.format_stack(frames[t.ident]))}"
                           for t in stuck if t.ident in frames)
        self._abort(CollectiveTimeout("ranks did not finish"))
        for thread in stuck:
            thread.join(self.timeout)
        raise CollectiveTimeout(f"{', '.join(t.name for t in stuck)} still running after {limit:.0f} s, "
                                f"outside any collective:\n{stacks}")

    def _abort(self, cause: BaseException) -> None:
        with self._cond:
            if self._abort_cause is None:
                self._abort_cause = cause
            self._cond.notify_all()

    # --- collectives: each rank's n-th call meets the other ranks' n-th ----------------------------------
    def exchange(self, rank: int, kind: str, name: str, payload: Any) -> list[Any]:
        """Every rank's payload of this collective, in rank order (blocking)."""
        return self.wait(rank, self.start(rank, kind, name, payload))

    def start(self, rank: int, kind: str, name: str, payload: Any) -> int:
        """Enter a collective without waiting (an async op); returns its number, for `wait`."""
        with self._cond:
            self._raise_if_aborted(rank)
            number = self._calls[rank]
            self._calls[rank] += 1
            slot = self._slots.setdefault(number, [None] * self.size)
            slot[rank] = _Call(kind, name, payload)
            self._check_agreement(number, slot)
            if all(slot):  # waiters wake only when their collective completes (or on abort, or a rank ends)
                self._cond.notify_all()
            return number

    def wait(self, rank: int, number: int) -> list[Any]:
        deadline = time.monotonic() + self.timeout
        with self._cond:
            slot = self._slots[number]
            while not all(slot):
                self._raise_if_aborted(rank)
                self._check_no_rank_gone(rank, number, slot)
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [r for r, call in enumerate(slot) if call is None]
                    self._fail(CollectiveTimeout(
                        f"rank {rank} waited {self.timeout:g} s in collective #{number} "
                        f"({slot[rank].describe()}) for rank(s) {missing}"))  # type: ignore[union-attr]
                self._cond.wait(left)
            self._reads[number] = self._reads.get(number, 0) + 1
            if self._reads[number] == self.size:
                del self._slots[number], self._reads[number]
            return [call.payload for call in slot]  # type: ignore[union-attr]

    def _check_agreement(self, number: int, slot: list[_Call | None]) -> None:
        entered = [(rank, call) for rank, call in enumerate(slot) if call is not None]
        first = entered[0][1]
        for _, call in entered[1:]:
            same = (call.kind, call.name) == (first.kind, first.name) and (
                not call.kind.startswith("allreduce") or np.shape(call.payload) == np.shape(first.payload))
            if not same:
                calls = "; ".join(f"rank {rank}: {call.describe()}" for rank, call in entered)
                self._fail(CollectiveMismatch(f"collective #{number} differs between ranks ({calls}): "
                                              "a real job would hang or fail here"))

    def _check_no_rank_gone(self, rank: int, number: int, slot: list[_Call | None]) -> None:
        gone = [r for r, call in enumerate(slot) if call is None and self._finished[r]]
        if gone:
            self._fail(CollectiveMismatch(
                f"rank(s) {gone} finished after {[self._calls[r] for r in gone]} collective(s) while rank "
                f"{rank} waits in collective #{number} ({slot[rank].describe()}): "  # type: ignore[union-attr]
                "a real job would hang here"))

    def _fail(self, error: WorldError) -> None:
        """Abort the world with `error` as the cause and raise it on this rank (the lock is held)."""
        if self._abort_cause is None:
            self._abort_cause = error
        self._cond.notify_all()
        raise error

    def _raise_if_aborted(self, rank: int) -> None:
        if self._abort_cause is not None:
            raise WorldAborted(f"rank {rank}: the world was aborted by {self._abort_cause!r}")


@contextlib.contextmanager
def _logging_restored() -> Iterator[None]:
    """configure_logging, called by every rank thread, changes the process-wide hvdazure logger."""
    saved = logger.level, list(logger.handlers), logger.propagate
    try:
        yield
    finally:
        logger.setLevel(saved[0])
        logger.handlers[:] = saved[1]
        logger.propagate = saved[2]


# --- the model: linear regression, 0.5 x mean squared error ----------------------------------------------
@dataclass(frozen=True)
class LinearProblem:
    """y = x @ w_true + noise, in float64: a training set and an optional evaluation set."""

    x: np.ndarray
    y: np.ndarray
    eval_x: np.ndarray | None = None
    eval_y: np.ndarray | None = None

    @classmethod
    def make(cls, num_samples: int, num_eval: int = 0, dim: int = 3, seed: int = 0) -> LinearProblem:
        rng = np.random.default_rng([seed, num_samples, num_eval, dim])
        w_true = rng.normal(size=dim)

        def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
            x = rng.normal(size=(n, dim))
            return x, x @ w_true + 0.1 * rng.normal(size=n)

        x, y = draw(num_samples)
        eval_x, eval_y = draw(num_eval) if num_eval else (None, None)
        return cls(x, y, eval_x, eval_y)

    @property
    def num_samples(self) -> int:
        return len(self.y)

    @property
    def dim(self) -> int:
        return self.x.shape[1]

    def sample_losses(self, w: np.ndarray, indices: Sequence[int], eval_set: bool = False) -> np.ndarray:
        x, y = (self.eval_x, self.eval_y) if eval_set else (self.x, self.y)
        assert x is not None and y is not None
        residual = x[list(indices)] @ w - y[list(indices)]
        return 0.5 * residual**2

    def loss_and_gradient(self, w: np.ndarray, indices: Sequence[int]) -> tuple[float, np.ndarray]:
        """Mean loss over `indices` and its gradient (the mean of the samples' gradients)."""
        if not indices:
            raise AssertionError("a forward pass on no samples")
        x, y = self.x[list(indices)], self.y[list(indices)]
        residual = x @ w - y
        return float(np.mean(0.5 * residual**2)), x.T @ residual / len(indices)


@dataclass(frozen=True)
class FakeData:
    """An evaluation or prediction set of the fake: inputs and targets."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.y)

    def losses(self, w: np.ndarray, indices: Sequence[int]) -> np.ndarray:
        residual = self.x[list(indices)] @ w - self.y[list(indices)]
        return 0.5 * residual**2


def initial_weights(dim: int, seed: int, rank: int) -> np.ndarray:
    """Each rank builds different weights: only a broadcast from rank 0 makes them equal."""
    return np.random.default_rng([seed, rank, 7]).normal(size=dim)


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step as one rank ran it."""

    epoch: int
    step: int  # optimizer steps before this one, over the whole training (resumed runs included)
    lr: float
    micro_batches: list[list[int]]  # this rank's sample indices, per micro-batch (empty: no forward pass)
    loss_weights: list[float | None]  # per micro-batch; None where it was empty
    random_draw: float  # one draw from this rank's framework RNG: shows the stream across a resume


# --- the user's trainer and its backend -------------------------------------------------------------------
class FakeTrainer(Trainer):
    """One rank of a ThreadWorld, training a LinearProblem with SGD (optionally with momentum) on a
    FakeBackend.

    What it ran is kept for the tests: `steps` (a StepRecord per optimizer step), `weights`, `velocity`,
    `forward_passes`, `sanity_checks`. Override `training_metrics` and `validation_metrics` (hooks, as
    training_step and validation_step are) to report more metrics than the loss. `data_delay`: seconds each
    training batch takes to load (a slow loader)."""

    data_delay = 0.0

    def __init__(self, world: ThreadWorld, rank: int, problem: LinearProblem, config: TrainConfig,
                 callbacks: Sequence[Callback] = (), momentum: float = 0.0, order: SampleOrder | None = None,
                 data_fingerprint: str | None = None) -> None:
        """`order`: the training data's order as a sharded dataset's would be (a ShardOrder over the
        problem's samples; None: the uniform permutation of data in memory); `data_fingerprint`: what a
        sharded dataset's index would hash to (None: none, as for data in memory)."""
        self.world, self.problem, self.momentum = world, problem, momentum
        self.order, self.fake_data_fingerprint = order, data_fingerprint
        self._world_rank = rank
        self.backend = FakeBackend(self)
        super().__init__(config, callbacks, backend=self.backend)

    def training_metrics(self, indices: list[int]) -> dict[str, float]:
        """Metrics besides the loss for one micro-batch (means over `indices`); none by default."""
        return {}

    def validation_metrics(self, indices: range) -> dict[str, Any]:
        """Evaluation metrics besides the loss for one batch of the evaluation set; none by default."""
        return {}

    def device_stats(self) -> tuple[float, float, float]:
        """What this rank's accelerator would report per log interval (Backend.device_stats): none, as on
        CPUs, by default."""
        return no_device()

    def predict_dataset(self) -> Any:
        """The data predict() predicts when given none: none, as the bindings' default."""
        return None

    def test_dataset(self) -> Any:
        """The data test() evaluates when given none: the problem's evaluation set, (x, y), if any."""
        return None if self.problem.eval_y is None else (self.problem.eval_x, self.problem.eval_y)

    def receive_signal(self, signum: int = signal.SIGTERM) -> None:
        """What a real rank's SIGTERM/SIGINT handler does (TrainingLoop.note_signal)."""
        loop_of(self).note_signal(signum)

    @property
    def steps(self) -> list[StepRecord]:
        return self.backend.steps

    @property
    def weights(self) -> np.ndarray:
        return self.backend.weights

    @property
    def velocity(self) -> np.ndarray:
        return self.backend.velocity

    @property
    def forward_passes(self) -> int:
        return self.backend.forward_passes

    @property
    def sanity_checks(self) -> int:
        return self.backend.sanity_checks


class FakeBackend(Backend):
    """Linear regression with SGD on the rank threads of the trainer's ThreadWorld."""

    framework_name = "numpy-threads"

    def __init__(self, user: FakeTrainer) -> None:
        self.user = user
        self.problem, self.momentum = user.problem, user.momentum
        self.steps: list[StepRecord] = []
        self.forward_passes = 0
        self.sanity_checks = 0  # evaluations of one batch before training (TrainConfig.sanity_check)
        self.lr = 0.0
        self.weights = np.zeros(self.problem.dim)
        self.velocity = np.zeros(self.problem.dim)
        self.rng = np.random.default_rng()
        self.predicted_batches: list[list[int]] = []  # this rank's, in the order predicted
        self.profilers: list[RecordingProfiler] = []  # each one the core asked for, in order
        self.events: list[str] = []  # the profilers' calls, and what a test's callbacks add, in order

    # --- running the model ---------------------------------------------------------------------------------
    def _start(self, comm: Any) -> FakeCollectives:
        self.collectives = FakeCollectives(self.user.world, self.user._world_rank)
        return self.collectives

    def shutdown(self) -> None:
        pass

    def load_datasets(self) -> SampleOrder:
        order = self.user.order
        return order if order is not None else UniformOrder(self.problem.num_samples)

    def data_fingerprint(self) -> str | None:
        return self.user.fake_data_fingerprint

    def build(self, peak_lr: float) -> FakeCheckpointContent:
        self.lr = peak_lr
        self.weights = initial_weights(self.problem.dim, self.config.seed, self.collectives.rank)
        self.velocity = np.zeros(self.problem.dim)
        return FakeCheckpointContent(self)

    def broadcast_model_and_optimizer(self) -> None:
        weights, velocity = self.collectives.exchange("broadcast", "model_and_optimizer",
                                                      (self.weights.copy(), self.velocity.copy()))[0]
        self.weights, self.velocity = weights.copy(), velocity.copy()

    def set_lr(self, lr: float) -> None:
        self.lr = lr

    def epoch_batches(self, steps: StepCursor) -> Iterator[Any]:
        """The batches are the micro-batches' sample indices: the model reads the problem's arrays. Each
        is ready after the trainer's `data_delay` seconds (a slow loader)."""
        delay = self.user.data_delay
        for micro_batch in loaded_cells(steps):
            if delay:
                time.sleep(delay)
            yield micro_batch.indices

    def run_step(self, step: RankStep, meter: MetricAccumulator, stop_vote: float | None) -> float:
        votes = None if stop_vote is None else self.collectives.allreduce_sum_async([stop_vote], "stop_vote")
        gradient = np.zeros(self.problem.dim)
        weights: list[float | None] = []
        state, times = self.user.state, self.clock  # the phases charged as the bindings charge them
        for micro_batch, batch, weight in step:
            since = times.now()
            if batch is None:  # no forward pass; this rank still joins the gradient average
                weights.append(None)
                continue
            assert batch == micro_batch.indices, "the step's batches are not its micro-batches"
            self.micro_batch = micro_batch  # as the bindings: training_step (here training_metrics) reads it
            self.forward_passes += 1
            loss, micro_gradient = self.problem.loss_and_gradient(self.weights, batch)
            gradient += weight * micro_gradient
            weights.append(weight)
            meter.add({"loss": loss, **self.user.training_metrics(batch)}, len(batch))
            times.add("compute", since)
        since = times.now()
        averaged = self._allreduce_average(gradient, "gradients")
        since = times.add("exchange", since)
        self.velocity = self.momentum * self.velocity + averaged
        self.weights = self.weights - self.lr * self.velocity
        times.add("optimizer", since)
        self.steps.append(StepRecord(state.epoch, state.step, self.lr,
                                     [mb.indices for mb in step.micro_batches], weights,
                                     float(self.rng.random())))
        return votes()[0] if votes is not None else 0.0

    def evaluate(self, meter: MetricAccumulator, first_batch_only: bool = False,
                 data: FakeData | None = None) -> bool:
        if data is None and self.problem.eval_y is None:
            return False
        data = data if data is not None else FakeData(self.problem.eval_x, self.problem.eval_y)
        c, size, rank = self.config, self.collectives.size, self.collectives.rank
        mine = eval_range(len(data), size, rank)
        batches = [range(start, min(start + c.batch_size, mine.stop))
                   for start in range(mine.start, mine.stop, c.batch_size)]
        if first_batch_only:
            self.sanity_checks += 1
            batches = [first_eval_batch(len(data), c.batch_size, size, rank)]
        for batch in batches:
            if batch:
                metrics = {"loss": float(np.mean(data.losses(self.weights, batch))),
                           **self.user.validation_metrics(batch)}
                meter.add(metrics, len(batch))
        return True

    def inference_data(self, dataset: Any, purpose: str) -> FakeData:
        """`dataset`: (x, y) arrays."""
        return FakeData(*dataset)

    def predict(self, data: FakeData, batches: list[range]) -> Iterator[Any]:
        """Each sample's index and prediction x @ w."""
        for batch in batches:
            self.predicted_batches.append(list(batch))
            yield {"index": np.array(list(batch)), "y": data.x[list(batch)] @ self.weights}

    def output_as_numpy(self, value: Any) -> Any:
        return np.asarray(value)

    def prediction_writer(self, output: str) -> PredictionShards:
        return PredictionShards(output)  # hvdazure.data's, as the bindings: real shards

    model_file = "model.npy"

    def load_model_file(self, path: str) -> None:
        weights = np.load(path, allow_pickle=False)
        if weights.shape != self.weights.shape:
            raise ValueError(f"weights of shape {weights.shape}, the model's {self.weights.shape}")
        self.weights = weights

    def step_profiler(self) -> RecordingProfiler:
        self.profilers.append(RecordingProfiler(self.events))
        return self.profilers[-1]

    def device_stats(self) -> tuple[float, float, float]:
        return self.user.device_stats()

    def _allreduce_average(self, values: np.ndarray, name: str) -> np.ndarray:
        """As Horovod's Average: the sum over ranks (in rank order), divided by the world size."""
        rows = self.collectives.exchange("allreduce_average", name, values.copy())
        return np.sum(rows, axis=0) / self.collectives.size


class FakeCollectives(Collectives):
    """The core's collectives between the rank threads of a ThreadWorld."""

    def __init__(self, world: ThreadWorld, rank: int) -> None:
        super().__init__(rank, world.size, rank)
        self.world = world

    def exchange(self, kind: str, name: str, payload: Any) -> list[Any]:
        return self.world.exchange(self.rank, kind, name, payload)

    def allreduce_sum_async(self, values: Sequence[Any], name: str) -> Callable[[], list[float]]:
        """Started before the step and awaited after it, as the torch binding's stop vote."""
        number = self.world.start(self.rank, "allreduce", name, [float(v) for v in values])

        def wait() -> list[float]:
            rows = self.world.wait(self.rank, number)
            return [float(sum(column)) for column in zip(*rows, strict=True)]

        return wait

    def allgather_floats(self, values: Sequence[Any]) -> list[list[float]]:
        return self.exchange("allgather_floats", "rows", [float(v) for v in values])

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        if self.rank == 0 and not isinstance(data, bytes):
            raise TypeError(f"rank 0 broadcasts bytes, got {type(data).__name__}")
        return self.exchange("broadcast_bytes", "bytes", data)[0]

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        return self.exchange("allgather_bytes", "bytes", bytes(data))


class FakeCheckpointContent(FrameworkCheckpointContent):
    """The fake's model (weights), optimizer (velocity) and per-rank RNG in checkpoints."""

    def __init__(self, backend: FakeBackend) -> None:
        self.backend = backend

    def save_files(self, copy: bool) -> dict[str, Callable[[BinaryIO], None]]:
        t = self.backend
        weights, velocity = (t.weights.copy(), t.velocity.copy()) if copy else (t.weights, t.velocity)
        return {"model.npy": lambda file: np.save(file, weights, allow_pickle=False),
                "optimizer.npy": lambda file: np.save(file, velocity, allow_pickle=False)}

    def load_files(self, paths: dict[str, str]) -> None:
        t = self.backend
        loaded = {name: np.load(paths[name], allow_pickle=False) for name in ("model.npy", "optimizer.npy")}
        for name, array in loaded.items():
            if array.shape != t.weights.shape or array.dtype != np.float64:
                raise ValueError(f"{name} holds {array.dtype} {array.shape}; the model is float64 "
                                 f"{t.weights.shape}")
        t.weights, t.velocity = loaded["model.npy"], loaded["optimizer.npy"]

    def state_dict(self) -> dict[str, Any]:
        return {"momentum": self.backend.momentum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["momentum"] != self.backend.momentum:
            raise ValueError(f"checkpoint of momentum {state['momentum']}, trainer of "
                             f"{self.backend.momentum}")

    def save_rng(self) -> dict[str, Any]:
        return self.backend.rng.bit_generator.state

    def load_rng(self, state: dict[str, Any]) -> None:
        self.backend.rng = np.random.default_rng()
        self.backend.rng.bit_generator.state = state

    def seed(self, seed: int) -> None:
        self.backend.rng = np.random.default_rng(seed)



class RecordingProfiler(StepProfiler):
    """A test double of a framework's profiler (what TorchProfiler is): it records the core's calls, in
    `calls` and in its rank's `events` (where a test's callbacks may note theirs), and writes as its trace a
    JSON list of the steps it marked."""

    def __init__(self, events: list[str]) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.events = events
        self._marked: list[int] = []
        self._path = Path()

    def _record(self, *call: Any) -> None:
        self.calls.append(call)
        self.events.append(f"profiler {call[0]}" + (f" {call[1]}" if call[0] == "begin_step" else ""))

    def start(self, directory: Path, label: str) -> None:
        self._record("start", directory, label)
        self._path = directory / f"{label}.json"

    def begin_step(self, step: int) -> None:
        self._record("begin_step", step)
        self._marked.append(step)

    def end_step(self) -> None:
        self._record("end_step")

    def stop(self) -> ProfilerTrace:
        self._record("stop")
        self._path.write_text(json.dumps(self._marked))
        return ProfilerTrace(str(self._path), "chrome")
