"""The training loop's state and machinery, held by the user's trainer (core/trainer.py) under one
private name, so that a subclass's own names never meet the loop's. It holds the framework `Backend`
(core/backend.py), which a binding (hvdazure.torch, hvdazure.tensorflow) creates and which calls the user's
hooks.

The loop emits named events (core/callbacks.py) with the user's trainer; logging, LR warmup, early stopping
and periodic checkpoints are callbacks. Every collective in the loop is entered by all ranks at the same
point: step counts per epoch are equal on every rank by construction (core/sample_plan.py) and every decision
comes from reduced values.
"""


from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Sequence
from typing import Any

from hvdazure.core import run_context
from hvdazure.core.agreement import Failure, rank0_decides
from hvdazure.core.backend import Backend, Collectives, DataError, RankStep, refuse_adasum_without_mpi
from hvdazure.core.callbacks import BuiltinCallback, Callback
from hvdazure.core.checkpoint.store import CheckpointError
from hvdazure.core.checkpoint.trainer_checkpoints import (
    CallbackStates,
    CheckpointPieces,
    ResumePoint,
    TrainerCheckpoints,
    data_order_record,
    default_checkpoint_dir,
)
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.default_callbacks import default_callbacks
from hvdazure.core.environments import Environment, detect_environment
from hvdazure.core.inference import Inference
from hvdazure.core.lr import LRSchedule
from hvdazure.core.metrics import HookReturnError, MetricAccumulator, RunningMean
from hvdazure.core.nonfinite import RECORD, NonFiniteError, NonFiniteWatch
from hvdazure.core.preflight import (
    NO_EVAL_SAMPLES,
    check_global_batch,
    check_micro_batch_sizes,
    check_validation_step,
)
from hvdazure.core.profiling import ProfiledSteps, profiled_steps, with_profile_from
from hvdazure.core.rank_logging import configure_logging, logger
from hvdazure.core.resumption import (
    LastFit,
    continue_from,
    refuse_fit_again,
    reopen_cut_epoch,
    run_manifest,
)
from hvdazure.core.run_protocol import Run
from hvdazure.core.sample_plan import MicroBatch, SamplePlan
from hvdazure.core.seeds import RankRandomState, rank_seed
from hvdazure.core.state import TrainState
from hvdazure.core.step_batches import StepBatches
from hvdazure.core.step_times import Breakdown, FitTimes, RunFacts, StepTimes
from hvdazure.core.stop_signals import StopRequests


class TrainingLoop:
    """Runs `fit()` for `trainer` (the user's object, which callbacks are given): epochs of sharded optimizer
    steps, periodic metric reduction, evaluation, events; holds every piece of the run's state."""

    def __init__(self, trainer: Any, config: TrainConfig | None, callbacks: Sequence[Callback], comm: Any,
                 backend: Backend) -> None:
        context = run_context.current()
        config = config if config is not None else TrainConfig()
        self.trainer = trainer
        self.config = with_profile_from(os.environ, context.apply(config) if context is not None else config)
        self.comm = comm if comm is not None else (context.communicator if context is not None else None)
        self.state = TrainState()
        self.rank, self.world_size, self.local_rank = 0, 1, 0
        self.collectives: Collectives  # set by fit(): the backend's collectives over all ranks
        self.sample_plan: SamplePlan  # set by fit(): which samples this rank trains on, step by step
        self.schedule: LRSchedule  # set by fit()
        self.callbacks: list[Callback] = []  # set by fit(): the defaults and the user's, on this rank
        self._user_callbacks = list(callbacks) + (list(context.callbacks) if context is not None else [])
        self._context = context
        self.backend = backend
        self.checkpoints: TrainerCheckpoints | None = None
        self.environment: Environment  # set by fit(): the environment that started this process
        self._last_fit: LastFit | None = None  # how the last fit() ended, and its config
        self.inference = Inference(self)  # predict(), test() and the weights they use
        self.stops = StopRequests()  # a stop signal this rank received, or a request for one
        self._step_samples_here: int | None = None  # this rank's samples in the step running (log_metrics)
        self._in_run_step = False  # inside the backend's step: training_step may be what logs
        self.times = StepTimes(enabled=False)  # set by fit(): this rank's clock of the phases (step_times)
        self.fit_times = FitTimes()  # the reduced phase times: the interval's, the fit's, the last interval's
        self._fit_steps = 0  # optimizer steps this fit() has taken (its first is start-up)
        self._profile = ProfiledSteps.off()  # set by fit(): the steps this rank records a trace of

    # --- derived facts -----------------------------------------------------------------------------------
    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the rank that logs, reports and writes checkpoints."""
        return self.rank == 0

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step across all ranks: `batch_size` x world size x `grad_accum_steps`."""
        return self.config.global_batch_size(self.world_size)

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in an epoch at this world size (the last one may be short)."""
        return self.sample_plan.steps_per_epoch

    @property
    def schedule_step(self) -> int:
        """The optimizer step the LR schedule is at: by epochs and steps of the current world size."""
        return self.state.epoch * self.steps_per_epoch + self.state.step_in_epoch

    @property
    def micro_batch(self) -> MicroBatch | None:
        """The micro-batch being trained on (its sample indices and loss weight), for training_step."""
        return self.backend.micro_batch

    @property
    def last_times(self) -> Breakdown | None:
        """The phase times of the last log interval (reduced over ranks), for the loggers."""
        return self.fit_times.last

    @property
    def finished(self) -> bool:
        """Whether training has reached its end (at an epoch's end: whether that was the last epoch)."""
        return self._finished()

    def set_lr(self, lr: float) -> None:
        """Set the optimizer's learning rate (LRScheduleCallback does, every step the schedule changes it)."""
        self.backend.set_lr(lr)

    def log(self, message: str) -> None:
        """Log on rank 0 only (the built-in callbacks' lines; core/run_protocol.py's Run)."""
        logger.info(message)

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        """Metrics besides training_step's, reduced with them: weighted by this rank's samples of the step
        (of the micro-batch, from within training_step), in the interval's one collective, on to every
        logger and the epoch's history. From training_step or a step's callbacks only; one number each."""
        if self._step_samples_here is None:
            raise ConfigError("log_metrics is for a training step: call it from training_step or a "
                              "callback's on_step_begin / on_step_end (return evaluation metrics from "
                              "validation_step)")
        if "loss" in metrics:
            raise ConfigError("log_metrics: 'loss' is training_step's own metric; log it under another name")
        for name, value in metrics.items():
            if isinstance(value, bool) or not (isinstance(value, int | float) or hasattr(value, "shape")):
                raise HookReturnError(f"log_metrics: {name!r} is a {type(value).__name__}: log one number "
                                      "(or a one-element tensor)")
        micro_batch = self.backend.micro_batch if self._in_run_step else None
        count = len(micro_batch.indices) if micro_batch is not None else self._step_samples_here
        self._meter.add_logged(dict(metrics), count)

    def save_checkpoint(self, reason: str = "manual", wait: bool = True) -> str | None:
        """Checkpoint now; every rank must call this at the same step. With wait=False rank 0 writes in the
        background and training goes on; the name is returned once written (wait=True)."""
        if self.checkpoints is None:
            if self._last_fit is None:  # nothing trains yet: no run, no step, no checkpoint directory opened
                raise CheckpointError("save_checkpoint() before fit(): a checkpoint is a step of training "
                                      "(model, optimizer, data position); call it from a callback or hook "
                                      "during fit(), or after fit()")
            raise CheckpointError("checkpointing is off: set checkpoint_dir")
        self._reduce_metrics_and_votes()  # the interval's metrics go into the epoch's means, which it keeps
        since = self.times.now()
        saved = self.checkpoints.save(reason, self.state.step, wait=wait)
        self.times.add("checkpoint", since)
        return saved

    # --- the loop ------------------------------------------------------------------------------------------
    def fit(self) -> list[dict[str, Any]]:
        """Train; return the per-epoch history of train and eval metrics, identical on every rank. Called
        again on the same trainer, the same run goes on to the config's `epochs` and `max_steps`, which
        may have been raised in between (`_continue_run`)."""
        if self._last_fit is None:
            self.prepare()
        else:
            self._continue_run()
        self._last_fit = LastFit(False, self.config)  # until it returns: a fit() that raised is not continued
        self._fit_steps = 0
        self.fit_times.begin()
        self._profile = self._profiled_steps()
        self.times.row()  # the clock starts here: what came before is not this fit's
        with self.stops.caught(self.checkpoints is not None):
            try:
                self._emit("on_train_start")
                while not self._finished():
                    self._train_epoch()
            except (ConfigError, CheckpointError, NonFiniteError, SystemExit, KeyboardInterrupt):
                raise  # (after a non-finite step the weights are not finite: nothing to save)
            except Exception as exc:
                if self.checkpoints is not None:  # peers may be gone: rank 0 saves alone, if it can
                    self.checkpoints.save_emergency(f"error: {type(exc).__name__}", self.state.step)
                raise
            finally:
                self._profile.finish(self.state.step)  # a trace still recording: training ended first
            if self.checkpoints is not None:
                if self.checkpoints.last_saved_step != self.state.step:
                    self.save_checkpoint("final")
                since = self.times.now()
                self.checkpoints.finish_pending()  # a background write of this very step
                self.times.add("checkpoint", since)
            if self.times.enabled:  # what is left of the phase times is reduced (one collective)
                self.fit_times.fit_ends(self.collectives.allgather_floats(self.times.row()), self.is_main,
                                        self._run_facts)
            self._emit("on_train_end")
        self._last_fit = LastFit(True, self.config)
        return self.state.history

    def _train_epoch(self) -> None:
        s = self.state
        self._emit("on_epoch_start")
        for micro_batches in self._step_batches.epoch(s.epoch, start_sample=s.samples_in_epoch):
            self._step_samples_here = sum(len(mb.indices) for mb in micro_batches)
            self._profile.step_begins(s.step + 1)
            self._emit("on_step_begin")
            self._in_run_step = True
            try:
                signal_votes = self.backend.run_step(self._rank_step(micro_batches), self._meter,
                                                      self.stops.vote(self.checkpoints is not None))
            finally:
                self._in_run_step = False
            self.times.step_done(micro_batches[0].step_samples, first_of_fit=self._fit_steps == 0)
            self._fit_steps += 1
            s.step += 1
            s.step_in_epoch += 1
            s.samples_in_epoch += micro_batches[0].step_samples
            s.samples_seen += micro_batches[0].step_samples
            s.metrics_reduced = s.step % self.config.log_every == 0
            if s.metrics_reduced:
                self._reduce_metrics_and_votes()
                if self.times.enabled:
                    self.fit_times.interval_ends(self.is_main, self._fit_steps, self._run_facts)
            self._emit("on_step_end")
            self._profile.step_ended(s.step)
            self._step_samples_here = None
            if signal_votes > 0:
                self.stops.stop(self.save_checkpoint)
            if s.should_stop or self._max_steps_reached():
                break
        self._reduce_metrics_and_votes()  # the epoch's last, partial log interval
        epoch_done = s.samples_in_epoch == self.sample_plan.num_samples
        train = {f"train_{k}": v for k, v in self._epoch_means.means().items()}
        record = {"epoch": s.epoch, "step": s.step, "samples_seen": s.samples_seen, "lr": s.lr, **train}
        since = self.times.now()
        evaluated = self._eval_due(epoch_done) and self._run_evaluation()
        if evaluated:  # without evaluation data there is no evaluation phase to show
            self.times.add("eval", since)
        if evaluated:
            record.update({f"eval_{k}": v for k, v in s.eval_metrics.items()})
            self._emit("on_eval_end")
        s.history.append(record)
        if epoch_done:
            s.epoch, s.step_in_epoch, s.samples_in_epoch = s.epoch + 1, 0, 0
            self._epoch_means.reset()
        self._emit("on_epoch_end")
        self._reduce_metrics_and_votes()  # agree on stops asked for in evaluation or by epoch-end callbacks

    # --- predict and test (core/inference.py) ------------------------------------------------------------
    def predict(self, dataset: Any, checkpoint: str | None, output: str | None = None) -> Any:
        """Inference.predict: predict_step over `dataset`, in dataset order on every rank (or as shards)."""
        return self.inference.predict(dataset, checkpoint, output)

    def test(self, dataset: Any, checkpoint: str | None) -> dict[str, float]:
        """Inference.test: validation_step's exact means over `dataset`."""
        return self.inference.test(dataset, checkpoint)

    def ready_for_inference(self, what: str, checkpoint: str | None) -> str | None:
        """Inference.ready: ranks started, model built, `checkpoint`'s weights on every rank (for export)."""
        return self.inference.ready(what, checkpoint)

    @property
    def fit_started(self) -> bool:
        """Whether a fit() started the ranks and built the model (and may have trained it)."""
        return self._last_fit is not None

    # --- pieces of the loop --------------------------------------------------------------------------------
    def prepare(self) -> None:
        """What fit() does before the first step: start, build, resume if asked, broadcast from rank 0."""
        c = self.config
        self._start()
        checkpoint_dir = default_checkpoint_dir(c.checkpoint_dir, self.environment)
        if c.resume == "auto" and checkpoint_dir is None:
            raise ConfigError("config field 'resume': 'auto' needs checkpoint_dir")
        pieces = self._build()
        if checkpoint_dir is not None:
            self.checkpoints = self._trainer_checkpoints(checkpoint_dir, pieces)
        self.callbacks = [cb for cb in default_callbacks(c, self.environment, self.checkpoints, self._context)
                          + self._user_callbacks
                          if self.is_main or not cb.main_only]
        if self.checkpoints is not None:  # resumes if asked; refuses a directory holding another run's
            self.checkpoints.start_run(c.resume, self._continue_from, fallback=c.resume_from)
        elif c.resume is not None:
            # the directory above the checkpoint, as a URL too (pathlib would make abfs://c/run abfs:/c)
            parent = c.resume.rstrip("/").rpartition("/")[0] or "."
            self._trainer_checkpoints(parent, pieces).resume(c.resume, self._continue_from)
        self.backend.broadcast_model_and_optimizer()  # rank 0's model: as built, or as resumed there
        self._end_schedule_at_max_steps()
        check_micro_batch_sizes(c, self.sample_plan, self.world_size, self.state.samples_in_epoch,
                                self.backend.min_samples_per_micro_batch())
        self.state.lr = self.schedule.lr_at(self.schedule_step)
        check_validation_step(c, self.backend, self.new_meter("validation_step"), self._rng)

    def _start(self) -> None:
        """Start the backend's ranks; this rank's place, data plan and LR schedule."""
        backend, c = self.backend, self.config
        self.start_ranks()
        order = backend.load_datasets()
        check_global_batch(c, self.world_size, order.num_samples)
        self.sample_plan = SamplePlan(order.num_samples, c.batch_size, self.world_size, self.rank,
                                    c.grad_accum_steps, c.seed, order=order)
        self._data_order = data_order_record(self.sample_plan, backend.data_fingerprint())
        self.schedule = LRSchedule.from_config(c, self.world_size, self.sample_plan.steps_per_epoch)

    def start_ranks(self) -> None:
        """Start the backend's ranks (once per fit() or first predict/test); this rank's place in them."""
        backend, c = self.backend, self.config
        self.environment = detect_environment()  # once: what it answers is passed on from here
        # the step clock, given to the backend as it starts (its run_step charges its phases to it)
        self.times = StepTimes(enabled=c.step_times, device=backend.device_stats)
        self.collectives = backend.start(self.comm, lambda: self.config, self.times)
        if self._context is not None:
            self._context.shutdowns.append(backend.shutdown)
        refuse_adasum_without_mpi(c.reduce_op, self.collectives.controller)
        run_context.check_world(self.comm, self.collectives.size)
        self.rank, self.world_size = self.collectives.rank, self.collectives.size
        self.local_rank = self.collectives.local_rank
        configure_logging(self.rank)
        if backend.device_layout:
            logger.info(backend.device_layout)

    def _build(self) -> CheckpointPieces:
        """Build model and optimizer, seed this rank, set up the step's inputs and meters; returns what a
        checkpoint of this trainer saves and a resume loads."""
        backend, c = self.backend, self.config
        framework = backend.build(self.schedule.peak_lr)
        self._rng = RankRandomState(framework)
        self._rng.seed(rank_seed(c.seed, self.rank))  # dropout etc. differ between ranks
        # Average divides the summed gradients by the world size; the loss weights are shares of the whole
        # step, so multiply that division back out.
        self._ranks_averaged = 1 if c.reduce_op == "sum" else self.world_size
        self._step_batches = StepBatches(self.sample_plan, backend.epoch_batches, self.times)
        self._meter, self._epoch_means = self.new_meter(), RunningMean()
        self._nonfinite = NonFiniteWatch(c.on_nan_loss, self.is_main, loss_scaling=c.precision == "fp16")
        return CheckpointPieces(
            stateful={"state": self.state, "epoch_train": self._epoch_means,
                      "callbacks": CallbackStates(lambda: self.callbacks), "framework": framework},
            framework=framework, rng=self._rng, manifest=self._manifest)

    def _trainer_checkpoints(self, directory: str, pieces: CheckpointPieces) -> TrainerCheckpoints:
        return TrainerCheckpoints(directory, pieces, self.collectives, self.config,
                                  self.backend.framework_name, self.environment.job_id(os.environ))

    def _continue_from(self, point: ResumePoint) -> str:
        """A resume, once the checkpoint's pieces are loaded (core/resumption.py); returns the log line."""
        return continue_from(point, self.state, self.sample_plan, self._rng, self._data_order,
                             self.config.seed, self.rank, self.global_batch_size, self.schedule.peak_lr)

    def _profiled_steps(self) -> ProfiledSteps:
        """What this fit() records a profiler trace of (config field profile_steps), checked on every rank
        against the steps it will train (those left of its epochs, up to max_steps)."""
        c, s, plan = self.config, self.state, self.sample_plan
        epochs_left = max(0, c.epochs - s.epoch - 1)  # after the one in progress
        last = s.step + plan.steps_left(s.samples_in_epoch) + epochs_left * plan.steps_per_epoch
        ends_because = f"epochs {c.epochs} of {plan.steps_per_epoch} steps at this world size"
        if c.max_steps is not None and c.max_steps < last:
            last, ends_because = c.max_steps, f"max_steps {c.max_steps}"
        return profiled_steps(c, self.backend.step_profiler, range(s.step + 1, last + 1), ends_because,
                              self.rank, lambda check: rank0_decides(self.collectives, check, Failure(
                                  OSError, ConfigError, lambda exc: f"config field 'output_dir': {exc}")),
                              self.times)

    def _end_schedule_at_max_steps(self) -> None:
        """End the LR schedule at `max_steps`, which counts the steps taken (also before a resume at another
        world size, where the schedule's steps are of the new size)."""
        c = self.config
        if c.max_steps is not None:
            end = self.schedule_step + max(0, c.max_steps - self.state.step)
            total = min(self.schedule.total_steps, end)
            self.schedule = dataclasses.replace(self.schedule, total_steps=total)

    def _continue_run(self) -> None:
        """What a later fit() on the same trainer does before its first step: the run goes on from where the
        last fit() left it, in memory (model, optimizer, RNG streams, data position, callbacks, history and
        the checkpoints, under the same run id), to the config's `epochs` and `max_steps`, with the LR
        schedule recomputed for them, as a resume from its last checkpoint would. A ConfigError on every
        rank, before anything changes: after a fit() that raised (an error, a stop signal), when the
        config changed elsewhere than `epochs`, `max_steps` and `profile_steps`, and when both `epochs` and
        `max_steps` are reached already."""
        c, s = self.config, self.state
        refuse_fit_again(self._last_fit or LastFit(True, c), c, s, self.checkpoints is not None)
        s.should_stop, s.stop_requested, s.stop_reason = False, False, None  # as on a resume
        self.schedule = LRSchedule.from_config(c, self.world_size, self.sample_plan.steps_per_epoch)
        self._end_schedule_at_max_steps()
        reopen_cut_epoch(self.state)
        s.lr = self.schedule.lr_at(self.schedule_step)
        until = f"epochs {c.epochs}" + (f", max_steps {c.max_steps}" if c.max_steps is not None else "")
        logger.info(f"fit() again: the run goes on from epoch {s.epoch + 1}, step {s.step}, to {until}")

    def _manifest(self, reason: str) -> dict[str, Any]:
        """How a checkpoint of this step describes the run (core/resumption.py's run_manifest)."""
        return run_manifest(reason, self.state, self.config, self.world_size, self.global_batch_size,
                            self.schedule.peak_lr, self._data_order, self.backend.framework_name,
                            self.backend.framework_versions())

    def _rank_step(self, micro_batches: list[MicroBatch]) -> RankStep:
        """This rank's part of the step: its batches, read from the backend's epoch stream as the backend
        iterates them, and each micro-batch's loss weight."""
        return RankStep(micro_batches, self._step_batches.of_step(micro_batches),
                        [mb.loss_weight(self._ranks_averaged) for mb in micro_batches], self.state.step + 1)

    def _emit(self, event: str) -> None:
        """`event` of every callback on this rank, in order: hvdazure's own (BuiltinCallback) are given the
        run (this loop, as core/run_protocol.py's Run), so that what a subclass of the trainer overrides
        never reaches them; the user's are given the user's trainer."""
        run: Run = self
        for callback in self.callbacks:
            getattr(callback, event)(run if isinstance(callback, BuiltinCallback) else self.trainer)

    def gather_names(self, names: list[str]) -> list[list[str]]:
        return [json.loads(b) for b in self.collectives.allgather_bytes(json.dumps(names).encode())]

    def new_meter(self, hook: str = "training_step") -> MetricAccumulator:
        return MetricAccumulator(self.backend.metric_to_float64, hook)

    def _reduce_metrics_and_votes(self) -> None:
        """One fused collective: the interval's metric sums and counts, the ranks' stop votes and their
        records of non-finite steps (core/nonfinite.py: `stop` raises NonFiniteError here, on every rank)."""
        s, kept = self.state, 1 + len(RECORD)
        reduced = self._meter.reduce(self.collectives.allgather_floats, self.gather_names,
                                     flags=[float(s.stop_requested), *self.backend.nonfinite_record(),
                                            *self.times.row()])
        self._nonfinite.check([flags[1:kept] for flags in reduced.flags_by_rank], s.step, self.checkpoints)
        if len(reduced.flags) > kept:  # each rank's step times (the device's among them) after the above
            self.fit_times.interval.add_rows([flags[kept:] for flags in reduced.flags_by_rank])
        if reduced.count:
            s.train_metrics = reduced.means
        elif reduced.means:  # only metrics logged after the interval's last reduction (log_metrics)
            s.train_metrics = {**s.train_metrics, **reduced.means}
        if reduced.means:
            self._epoch_means.add(reduced)
        if reduced.flags[0]:
            s.should_stop = True
            s.stop_reason = s.stop_reason or "stop requested by another rank"

    def _run_facts(self) -> RunFacts:
        """What the step-time table's advice depends on (core/step_times.py)."""
        c = self.config
        return RunFacts(controller=self.collectives.controller,
                        nodes=self.environment.describe(os.environ).num_nodes,
                        grad_allreduce=c.grad_allreduce, checkpoint_async=c.checkpoint_async)

    def _run_evaluation(self) -> bool:
        meter = self.new_meter("validation_step")
        if not self.backend.evaluate(meter):
            return False
        reduced = meter.reduce(self.collectives.allgather_floats, self.gather_names)
        if not reduced.count:  # on every rank: the count is reduced
            raise DataError(NO_EVAL_SAMPLES)
        self.state.eval_metrics = reduced.means
        return True

    def _eval_due(self, epoch_done: bool) -> bool:
        s = self.state
        last = s.should_stop or self._max_steps_reached() or (
            epoch_done and s.epoch + 1 >= self.config.epochs)
        return last or (epoch_done and (s.epoch + 1) % self.config.eval_every == 0)

    def _max_steps_reached(self) -> bool:
        return self.config.max_steps is not None and self.state.step >= self.config.max_steps

    def _finished(self) -> bool:
        """Training ends by epochs completed (counted in samples, so it holds across a resume at another
        world size, where step numbers change meaning), by max_steps optimizer steps taken, or by a stop."""
        s = self.state
        return s.should_stop or self._max_steps_reached() or s.epoch >= self.config.epochs

    # --- stop signals (SIGTERM on preemption, SIGINT): core/stop_signals.py ---------------------------------
    def note_signal(self, signum: int) -> None:
        """A stop signal this rank received (what its SIGTERM/SIGINT handler does)."""
        self.stops.note_signal(signum)

    def request_checkpoint_and_exit(self, reason: str, signum: int = signal.SIGTERM) -> None:
        """Make every rank save a checkpoint at the next step and exit with 128 + `signum`, as a first
        SIGTERM does (it travels in the same per-step vote: no collective of its own). Safe to call from
        any thread of any rank, e.g. a watcher of the cloud's preemption notices. Needs checkpointing."""
        self.stops.request(reason, signum)


def loop_of(trainer: Any) -> TrainingLoop:
    """The loop a trainer (core/trainer.py's Trainer) holds, for hvdazure's own tools and tests (benchmarks
    that stop before the first step, test doubles that deliver a signal, the export command); not for
    training scripts. Here, not in trainer.py, so that what trainer.py calls may reach it too."""
    loop: TrainingLoop = trainer._Trainer__loop
    return loop
