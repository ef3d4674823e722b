"""The class a binding's trainer (TorchTrainer, TensorFlowTrainer) extends and a user subclasses: the user's
hooks, a few read-only facts about the run, and `fit`. The loop's state and machinery live in a
`TrainingLoop` (core/training_loop.py) held under one name-mangled attribute, so that no name a subclass
defines (`_build`, `_state`, `callbacks`, ...) can replace or be replaced by one of the loop's.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from typing import Any

from hvdazure.core.backend import Backend, Collectives
from hvdazure.core.callbacks import Callback
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.errors import UserError
from hvdazure.core.lr import LRSchedule
from hvdazure.core.rank_logging import logger
from hvdazure.core.sample_plan import MicroBatch, SamplePlan
from hvdazure.core.state import TrainState
from hvdazure.core.step_times import Breakdown
from hvdazure.core.training_loop import TrainingLoop, loop_of

__all__ = ["Trainer", "loop_of"]  # loop_of lives beside the loop; imported from here too


class Trainer:
    """Runs `fit()`: epochs of sharded optimizer steps, periodic metric reduction, evaluation, events."""

    def __init__(self, config: TrainConfig | None = None, callbacks: Sequence[Callback] = (),
                 comm: Any = None, *, backend: Backend) -> None:
        """`comm`: an mpi4py communicator to start Horovod on, for a program that runs several trainings in
        one MPI job (under the MPI controller only); default: every rank of the job. Inside
        `hvdazure sweep`, the trial's group of ranks, its parameters and callbacks (core/run_context.py).
        `backend`: the binding's side of training, which calls this trainer's hooks (a binding passes it)."""
        self.__loop = TrainingLoop(self, config, callbacks, comm, backend)

    # --- the run, as the hooks and callbacks may read it ---------------------------------------------------
    @property
    def config(self) -> TrainConfig:
        """The run's settings; a later `fit()` may go on with raised `epochs`/`max_steps`:
        `trainer.config = trainer.config.replace(epochs=...)`."""
        return self.__loop.config

    @config.setter
    def config(self, config: TrainConfig) -> None:
        self.__loop.config = config

    @property
    def state(self) -> TrainState:
        """Where training is (epoch, step, samples seen), its latest metrics and the per-epoch history."""
        return self.__loop.state

    @property
    def rank(self) -> int:
        """This rank's place in the job (0 before `fit()` starts Horovod)."""
        return self.__loop.rank

    @property
    def world_size(self) -> int:
        """The number of ranks training (1 before `fit()` starts Horovod)."""
        return self.__loop.world_size

    @property
    def local_rank(self) -> int:
        """This rank's place on its node: which GPU it uses."""
        return self.__loop.local_rank

    @property
    def comm(self) -> Any:
        """The mpi4py communicator Horovod runs on (None: every rank of the job)."""
        return self.__loop.comm

    @property
    def collectives(self) -> Collectives:
        """The backend's collectives over all ranks (once `fit()` has started)."""
        return self.__loop.collectives

    @property
    def sample_plan(self) -> SamplePlan:
        """Which samples this rank trains on, step by step (once `fit()` has started)."""
        return self.__loop.setup.sample_plan

    @property
    def shard_plan(self) -> SamplePlan:
        """The former name of `sample_plan` ("shard" now means a file of a ShardedDataset only)."""
        return self.__loop.setup.sample_plan

    @property
    def schedule(self) -> LRSchedule:
        """The LR schedule, scaled for the global batch (once `fit()` has started)."""
        return self.__loop.schedule

    @property
    def callbacks(self) -> list[Callback]:
        """The callbacks on this rank, the defaults then the user's (once `fit()` has started)."""
        return list(self.__loop.callbacks)

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the rank that logs, reports and writes checkpoints."""
        return self.__loop.is_main

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step across all ranks: `batch_size` x world size x `grad_accum_steps`."""
        return self.__loop.global_batch_size

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps in an epoch at this world size (the last one may be short)."""
        return self.__loop.steps_per_epoch

    @property
    def schedule_step(self) -> int:
        """The optimizer step the LR schedule is at: by epochs and steps of the current world size."""
        return self.__loop.schedule_step

    @property
    def micro_batch(self) -> MicroBatch | None:
        """The micro-batch being trained on (its sample indices and loss weight), for training_step."""
        return self.__loop.backend.micro_batch

    @property
    def step_times(self) -> Breakdown | None:
        """Where the last log interval's time went (means over ranks; config field step_times), on every
        rank: `.shares()`, `.seconds`, `.samples_per_second`, `.table(title)`; None before the first."""
        return self.__loop.last_times

    @property
    def finished(self) -> bool:
        """Whether training has reached its end (at an epoch's end: whether that was the last epoch)."""
        return self.__loop.finished

    # --- what the hooks and callbacks may do ---------------------------------------------------------------
    def log(self, message: str) -> None:
        """Log on rank 0 only."""
        logger.info(message)

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        """Log scalar metrics beside those training_step returns, from training_step (PyTorch) or a
        callback's on_step_begin / on_step_end: reduced over ranks with the step's metrics (each rank's
        value weighted by its samples of the step, one fused collective per log interval), shown in the
        log line, TensorBoard, MLflow and the epoch's history as train_<name>. Every rank may log
        different names (each is averaged over the samples that reported it)."""
        self.__loop.log_metrics(metrics)

    def set_lr(self, lr: float) -> None:
        """Set the optimizer's learning rate now (the run's LR schedule sets it every step through the loop,
        not through this method: a later step's schedule value replaces what is set here)."""
        self.__loop.set_lr(lr)

    def save_checkpoint(self, reason: str = "manual", wait: bool = True) -> str | None:
        """Checkpoint now; every rank must call this at the same step. With wait=False rank 0 writes in the
        background and training goes on; the name is returned once written (wait=True)."""
        return self.__loop.save_checkpoint(reason, wait)

    def request_checkpoint_and_exit(self, reason: str, signum: int = signal.SIGTERM) -> None:
        """Make every rank save a checkpoint at the next step and exit with 128 + `signum`, as a first
        SIGTERM does (it travels in the same per-step vote: no collective of its own). Safe to call from
        any thread of any rank, e.g. a watcher of the cloud's preemption notices. Needs checkpointing."""
        self.__loop.request_checkpoint_and_exit(reason, signum)

    def fit(self) -> list[dict[str, Any]]:
        """Train; return the per-epoch history of train and eval metrics, identical on every rank. Called
        again on the same trainer, the same run goes on to the config's `epochs` and `max_steps`, which
        may have been raised in between."""
        return self.__loop.fit()

    def predict(self, dataset: Any = None, checkpoint: str | None = None, output: str | None = None) -> Any:
        """predict_step's outputs for every sample of `dataset` (default: predict_dataset()), exactly once at
        any world size, in dataset order, on every rank: one NumPy array with a row per sample, or a dict of
        them where predict_step returns a dict. Each rank predicts a contiguous run of the set's batches of
        `batch_size`, the same batches at any world size. `checkpoint`: "latest", "best" (of the config's
        checkpoint_dir) or a checkpoint's path or URL (a directory hvdazure wrote), whose weights are loaded
        first. Without it: after fit(), the trained model; before any fit(), the model as build_model()
        returns it (pretrained weights it loads included), rank 0's weights sent to every rank. A model
        file from elsewhere (.pt, .safetensors, .keras) is loaded in build_model, not given as
        `checkpoint`. `output`: a new directory or URL (e.g.
        abfs://) to write the predictions to as a ShardedDataset instead, for more than memory holds (each
        rank its part, the index last); the ShardedDataset is returned. Every rank must call it."""
        return self.__loop.inference.predict(dataset, checkpoint, output)

    @classmethod
    def main(cls, argv: Sequence[str] | None = None, **defaults: Any) -> Any:
        """Run the script's command line (core/script/modes.py): `fit` (the default), `test [--checkpoint
        C] [--output metrics.json]`, `predict [--checkpoint C] --output predictions.npz` (or a directory or
        URL: shards; without --checkpoint, the model as build_model() returns it) or `export --checkpoint
        C --output model.onnx` (core/script/export.py: in one
        process, with the config the checkpoint records), then TrainConfig's `--config` / `--set` over
        `defaults`. Builds `cls(config)`; returns what the mode's method returns (rank 0 writes a file
        --output and logs the test metrics).

            if __name__ == "__main__":
                DigitsTrainer.main(epochs=15, lr=0.05)
        """
        import sys

        from hvdazure.core.script.modes import is_shards_output, parse_command, write_output

        try:
            command = parse_command(sys.argv[1:] if argv is None else argv)
        except ConfigError as exc:  # as TrainConfig.from_cli says a bad argument: one line, on every rank
            sys.stderr.write(f"hvdazure: error: {exc}\n")
            raise SystemExit(2) from None
        if command.mode == "export":  # one process; the config is the checkpoint's (core/script/export.py)
            from hvdazure.core.script.export import export_checkpoint, export_request

            try:  # in one process, as `hvdazure export`: every refusal is bad input, exit status 2
                request = export_request(command.checkpoint or "", command.output or "", command.config_args,
                                         defaults, format=command.format, example=command.example,
                                         overwrite=command.overwrite)
                done = export_checkpoint(cls, request, command.config_args, defaults)
            except UserError as exc:
                sys.stderr.write(f"hvdazure: error: {exc}\n")
                raise SystemExit(2) from None
            logger.info(f"export: {done.describe()}")
            return done
        trainer = cls(TrainConfig.from_cli(command.config_args, **defaults))  # type: ignore[call-arg]
        if command.mode == "fit":
            return trainer.fit()
        if command.mode == "test":
            result: Any = trainer.test(checkpoint=command.checkpoint)
            logger.info("test: " + " ".join(f"{k} {v:.6g}" for k, v in result.items()))
        elif command.output is not None and is_shards_output(command.output):
            return trainer.predict(checkpoint=command.checkpoint, output=command.output)
        else:
            result = trainer.predict(checkpoint=command.checkpoint)
        if command.output is not None and trainer.is_main:
            write_output(command.output, result)
            logger.info(f"{command.mode}: wrote {command.output}")
        return result

    def test(self, dataset: Any = None, checkpoint: str | None = None) -> dict[str, float]:
        """validation_step's metrics over every sample of `dataset` (default: test_dataset(), by default
        eval_dataset()), each the exact mean over all samples on all ranks, identical on every rank, as
        fit()'s evaluations compute them. `checkpoint` as for `predict`. Every rank must call it."""
        return self.__loop.inference.test(dataset, checkpoint)

