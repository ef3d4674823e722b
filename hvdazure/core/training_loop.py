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

import json
import os
import signal
from collections.abc import Sequence
from typing import Any

from hvdazure.core import run_context
from hvdazure.core.agreement import Failure, rank0_decides
from hvdazure.core.backend import Backend, DataError, RankStep
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
from hvdazure.core.inference import Inference
from hvdazure.core.metrics import HookReturnError, MetricAccumulator, RunningMean
from hvdazure.core.nonfinite import RECORD, NonFiniteError, NonFiniteWatch
from hvdazure.core.preflight import NO_EVAL_SAMPLES, check_micro_batch_sizes, check_validation_step
from hvdazure.core.profiling import ProfiledSteps, profile_this_fit, with_profile_from
from hvdazure.core.rank_logging import logger
from hvdazure.core.resumption import LastFit, continue_from, fit_again, run_manifest
from hvdazure.core.run_protocol import Run
from hvdazure.core.run_setup import RunSetup, SetupFacts, StartedRanks, plan_data, start_ranks
from hvdazure.core.sample_plan import MicroBatch
from hvdazure.core.seeds import RankRandomState, rank_seed
from hvdazure.core.state import TrainState
from hvdazure.core.step_batches import StepBatches
from hvdazure.core.step_times import Breakdown, FitTimes
from hvdazure.core.stop_signals import StopRequests


class TrainingLoop(SetupFacts):
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
        self._user_callbacks = list(callbacks) + (list(context.callbacks) if context is not None else [])
        self._context = context
        self.backend = backend
        self._ranks: StartedRanks | None = None  # start_ranks(): by fit(), or by a predict()/test() before it
        self._setup: RunSetup | None = None  # prepare(): the run's setup, made once (core/run_setup.py)
        self._last_fit: LastFit | None = None  # how the last fit() ended, and its config
        self.inference = Inference(self)  # predict(), test() and the weights they use
        self.stops = StopRequests()  # a stop signal this rank received, or a request for one
        self._step_samples_here: int | None = None  # this rank's samples in the step running (log_metrics)
        self._in_run_step = False  # inside the backend's step: training_step may be what logs
        self.fit_times = FitTimes()  # the reduced phase times: the interval's, the fit's, the last interval's
        self._fit_steps = 0  # optimizer steps this fit() has taken (its first is start-up)
        self._profile = ProfiledSteps.off()  # this fit()'s: the steps this rank records a trace of

    # --- what derives from the setup: core/run_setup.py's SetupFacts, a base of this class --------------
    @property
    def last_times(self) -> Breakdown | None:
        """The phase times of the last log interval (reduced over ranks), for the loggers."""
        return self.fit_times.last

    @property
    def finished(self) -> bool:
        """Whether training has reached its end (at an epoch's end: whether that was the last epoch): by
        epochs completed (counted in samples, so it holds across a resume at another world size, where step
        numbers change meaning), by max_steps optimizer steps taken, or by a stop."""
        s = self.state
        return s.should_stop or self._max_steps_reached() or s.epoch >= self.config.epochs

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
        self.setup.meter.add_logged(dict(metrics), count)

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
        since = self.ranks.clock.now()
        saved = self.checkpoints.save(reason, self.state.step, wait=wait)
        self.ranks.clock.add("checkpoint", since)
        return saved

    # --- the loop ------------------------------------------------------------------------------------------
    def fit(self) -> list[dict[str, Any]]:
        """Train; return the per-epoch history of train and eval metrics, identical on every rank. Called
        again on the same trainer, the same run goes on to the config's `epochs` and `max_steps`, which
        may have been raised in between (core/resumption.py's `fit_again`)."""
        if self._last_fit is None:
            self.prepare()
        else:
            self._setup = fit_again(self._last_fit, self.config, self.state, self.setup)
        setup, clock = self.setup, self.ranks.clock
        self._last_fit = LastFit(False, self.config)  # until it returns: a fit() that raised is not continued
        self._fit_steps = 0
        self.fit_times.begin()
        self._profile = profile_this_fit(  # checked on every rank: rank 0's output directory too
            self.config, self.state, setup.sample_plan, self.backend.step_profiler, self.rank,
            lambda check: rank0_decides(self.collectives, check, Failure(
                OSError, ConfigError, lambda exc: f"config field 'output_dir': {exc}")), clock)
        clock.row()  # the clock starts here: what came before is not this fit's
        with self.stops.caught(self.checkpoints is not None):
            try:
                self._emit("on_train_start")
                while not self.finished:
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
                since = clock.now()
                self.checkpoints.finish_pending()  # a background write of this very step
                clock.add("checkpoint", since)
            if clock.enabled:  # what is left of the phase times is reduced (one collective)
                self.fit_times.fit_ends(self.collectives.allgather_floats(clock.row()), self.is_main,
                                        self.run_facts)
            self._emit("on_train_end")
        self._last_fit = LastFit(True, self.config)
        return self.state.history

    def _train_epoch(self) -> None:
        s, setup, clock = self.state, self.setup, self.ranks.clock
        self._emit("on_epoch_start")
        for micro_batches in setup.step_batches.epoch(s.epoch, start_sample=s.samples_in_epoch):
            self._step_samples_here = sum(len(mb.indices) for mb in micro_batches)
            self._profile.step_begins(s.step + 1)
            self._emit("on_step_begin")
            self._in_run_step = True
            try:
                signal_votes = self.backend.run_step(self._rank_step(micro_batches), setup.meter,
                                                      self.stops.vote(self.checkpoints is not None))
            finally:
                self._in_run_step = False
            clock.step_done(micro_batches[0].step_samples, first_of_fit=self._fit_steps == 0)
            self._fit_steps += 1
            s.step += 1
            s.step_in_epoch += 1
            s.samples_in_epoch += micro_batches[0].step_samples
            s.samples_seen += micro_batches[0].step_samples
            s.metrics_reduced = s.step % self.config.log_every == 0
            if s.metrics_reduced:
                self._reduce_metrics_and_votes()
                if clock.enabled:
                    self.fit_times.interval_ends(self.is_main, self._fit_steps, self.run_facts)
            self._emit("on_step_end")
            self._profile.step_ended(s.step)
            self._step_samples_here = None
            if signal_votes > 0:
                self.stops.stop(self.save_checkpoint)
            if s.should_stop or self._max_steps_reached():
                break
        self._reduce_metrics_and_votes()  # the epoch's last, partial log interval
        epoch_done = s.samples_in_epoch == setup.sample_plan.num_samples
        train = {f"train_{k}": v for k, v in setup.epoch_means.means().items()}
        record = {"epoch": s.epoch, "step": s.step, "samples_seen": s.samples_seen, "lr": s.lr, **train}
        since = clock.now()
        evaluated = self._eval_due(epoch_done) and self._run_evaluation()
        if evaluated:  # without evaluation data there is no evaluation phase to show
            clock.add("eval", since)
        if evaluated:
            record.update({f"eval_{k}": v for k, v in s.eval_metrics.items()})
            self._emit("on_eval_end")
        s.history.append(record)
        if epoch_done:
            s.epoch, s.step_in_epoch, s.samples_in_epoch = s.epoch + 1, 0, 0
            setup.epoch_means.reset()
        self._emit("on_epoch_end")
        self._reduce_metrics_and_votes()  # agree on stops asked for in evaluation or by epoch-end callbacks

    # --- predict and test: core/inference.py (`inference`) -------------------------------------------------
    def ready_for_inference(self, what: str, checkpoint: str | None) -> str | None:
        """Inference.ready: ranks started, model built, `checkpoint`'s weights on every rank (for export)."""
        return self.inference.ready(what, checkpoint)

    @property
    def fit_started(self) -> bool:
        """Whether a fit() started the ranks and built the model (and may have trained it)."""
        return self._last_fit is not None

    # --- pieces of the loop --------------------------------------------------------------------------------
    def prepare(self) -> RunSetup:
        """What fit() does before the first step: start, build, resume if asked, broadcast from rank 0;
        returns the run's setup (core/run_setup.py), which the loop holds as `setup` from here on."""
        backend, c = self.backend, self.config
        self.start_ranks()
        ranks = self.ranks
        plan, schedule = plan_data(backend, c, ranks)
        data_order = data_order_record(plan, backend.data_fingerprint())  # the manifest's record of it
        checkpoint_dir = default_checkpoint_dir(c.checkpoint_dir, ranks.environment)
        if c.resume == "auto" and checkpoint_dir is None:
            raise ConfigError("config field 'resume': 'auto' needs checkpoint_dir")
        framework = backend.build(schedule.peak_lr)
        rng = RankRandomState(framework)
        rng.seed(rank_seed(c.seed, ranks.rank))  # dropout etc. differ between ranks
        meter, epoch_means = self.new_meter(), RunningMean()
        pieces = CheckpointPieces(  # what a checkpoint of this trainer saves and a resume loads
            stateful={"state": self.state, "epoch_train": epoch_means,
                      "callbacks": CallbackStates(lambda: self.callbacks), "framework": framework},
            framework=framework, rng=rng, manifest=self._manifest)
        checkpoints = None if checkpoint_dir is None else self._trainer_checkpoints(checkpoint_dir, pieces)
        callbacks = [cb for cb in default_callbacks(c, ranks.environment, checkpoints, self._context)
                     + self._user_callbacks if ranks.rank == 0 or not cb.main_only]
        self._setup = RunSetup(
            ranks, plan, data_order, schedule, rng, StepBatches(plan, backend.epoch_batches, ranks.clock),
            # Average divides the summed gradients by the world size; the loss weights are shares of the
            # whole step, so multiply that division back out.
            1 if c.reduce_op == "sum" else ranks.world_size, meter, epoch_means,
            NonFiniteWatch(c.on_nan_loss, ranks.rank == 0, loss_scaling=c.precision == "fp16"),
            checkpoints, tuple(callbacks))
        if checkpoints is not None:  # resumes if asked; refuses a directory holding another run's
            checkpoints.start_run(c.resume, self._continue_from, fallback=c.resume_from)
        elif c.resume is not None:
            # the directory above the checkpoint, as a URL too (pathlib would make abfs://c/run abfs:/c)
            parent = c.resume.rstrip("/").rpartition("/")[0] or "."
            self._trainer_checkpoints(parent, pieces).resume(c.resume, self._continue_from)
        backend.broadcast_model_and_optimizer()  # rank 0's model: as built, or as resumed there
        setup = self._setup = self._setup.ending_at_max_steps(c.max_steps, self.state)
        check_micro_batch_sizes(c, plan, ranks.world_size, self.state.samples_in_epoch,
                                backend.min_samples_per_micro_batch())
        self.state.lr = setup.schedule.lr_at(self.schedule_step)
        check_validation_step(c, backend, self.new_meter("validation_step"), rng)
        return setup

    def start_ranks(self) -> None:
        """Start the backend's ranks (once per fit() or first predict/test); this rank's place in them."""
        self._ranks = start_ranks(self.backend, self.comm, lambda: self.config, self._context)

    def _trainer_checkpoints(self, directory: str, pieces: CheckpointPieces) -> TrainerCheckpoints:
        return TrainerCheckpoints(directory, pieces, self.collectives, self.config,
                                  self.backend.framework_name, self.environment.job_id(os.environ))

    def _continue_from(self, point: ResumePoint) -> str:
        """A resume, once the checkpoint's pieces are loaded (core/resumption.py); returns the log line."""
        setup = self.setup
        return continue_from(point, self.state, setup.sample_plan, setup.rng, setup.data_order,
                             self.config.seed, self.rank, self.global_batch_size, setup.schedule.peak_lr)

    def _manifest(self, reason: str) -> dict[str, Any]:
        """How a checkpoint of this step describes the run (core/resumption.py's run_manifest)."""
        return run_manifest(reason, self.state, self.config, self.world_size, self.global_batch_size,
                            self.setup.schedule.peak_lr, self.setup.data_order, self.backend.framework_name,
                            self.backend.framework_versions())

    def _rank_step(self, micro_batches: list[MicroBatch]) -> RankStep:
        """This rank's part of the step: its batches, read from the backend's epoch stream as the backend
        iterates them, and each micro-batch's loss weight."""
        setup = self.setup
        return RankStep(micro_batches, setup.step_batches.of_step(micro_batches),
                        [mb.loss_weight(setup.ranks_averaged) for mb in micro_batches], self.state.step + 1)

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
        s, setup, kept = self.state, self.setup, 1 + len(RECORD)
        reduced = setup.meter.reduce(self.collectives.allgather_floats, self.gather_names,
                                     flags=[float(s.stop_requested), *self.backend.nonfinite_record(),
                                            *setup.ranks.clock.row()])
        setup.nonfinite.check([flags[1:kept] for flags in reduced.flags_by_rank], s.step, self.checkpoints)
        if len(reduced.flags) > kept:  # each rank's step times (the device's among them) after the above
            self.fit_times.interval.add_rows([flags[kept:] for flags in reduced.flags_by_rank])
        if reduced.count:
            s.train_metrics = reduced.means
        elif reduced.means:  # only metrics logged after the interval's last reduction (log_metrics)
            s.train_metrics = {**s.train_metrics, **reduced.means}
        if reduced.means:
            setup.epoch_means.add(reduced)
        if reduced.flags[0]:
            s.should_stop = True
            s.stop_reason = s.stop_reason or "stop requested by another rank"

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
