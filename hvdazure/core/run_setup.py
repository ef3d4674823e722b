"""The run's setup: what fit() decides once, before its first step (core/training_loop.py's `prepare()`),
and holds to the end: where this process is among the ranks, the data plan, the LR schedule, the pieces of
the step, the checkpoints and the callbacks. One frozen record, made whole at once, so that nothing of the
setup appears midway through fit() or changes under it. What a run replaces is its schedule (at
`max_steps`; for another fit() of the same trainer): a new record, by `dataclasses.replace`. The objects it
holds may have state of their own (the clock runs, the meters fill, the RNG streams advance); which objects
they are does not change.

`start_ranks` is the first part, alone: predict()/test() before any fit() start the ranks and need no more.
`SetupFacts` (a base of the loop) shows what derives from the two records: rank, world size, schedule, ...
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hvdazure.core import run_context
from hvdazure.core.backend import Backend, Collectives, refuse_adasum_without_mpi
from hvdazure.core.callbacks import Callback
from hvdazure.core.checkpoint.trainer_checkpoints import TrainerCheckpoints
from hvdazure.core.config import TrainConfig
from hvdazure.core.environments import Environment, detect_environment
from hvdazure.core.lr import LRSchedule
from hvdazure.core.metrics import MetricAccumulator, RunningMean
from hvdazure.core.nonfinite import NonFiniteWatch
from hvdazure.core.preflight import check_global_batch
from hvdazure.core.rank_logging import configure_logging, logger
from hvdazure.core.sample_plan import SamplePlan
from hvdazure.core.seeds import RankRandomState
from hvdazure.core.state import TrainState
from hvdazure.core.step_batches import StepBatches
from hvdazure.core.step_times import RunFacts, StepTimes


@dataclass(frozen=True)
class StartedRanks:
    """This process among the started ranks: the environment that started it, the backend's collectives,
    its place in them, and the step clock the backend charges its phases to."""

    environment: Environment
    collectives: Collectives
    clock: StepTimes
    rank: int
    world_size: int
    local_rank: int


def start_ranks(backend: Backend, comm: Any, config: Callable[[], TrainConfig],
                context: run_context.RunContext | None) -> StartedRanks:
    """Start the backend's ranks (once per fit() or first predict/test) on `comm`; `config` gives the run's
    config as it is now (the backend asks it again later: another fit() may raise epochs)."""
    c = config()
    environment = detect_environment()  # once: what it answers is passed on from here
    clock = StepTimes(enabled=c.step_times, device=backend.device_stats)  # the backend's run_step charges it
    collectives = backend.start(comm, config, clock)
    if context is not None:
        context.shutdowns.append(backend.shutdown)
    refuse_adasum_without_mpi(c.reduce_op, collectives.controller)
    run_context.check_world(comm, collectives.size)
    ranks = StartedRanks(environment, collectives, clock, collectives.rank, collectives.size,
                         collectives.local_rank)
    configure_logging(ranks.rank)
    if backend.device_layout:
        logger.info(backend.device_layout)
    return ranks


def plan_data(backend: Backend, config: TrainConfig, ranks: StartedRanks) -> tuple[SamplePlan, LRSchedule]:
    """Load the datasets; this rank's sample plan and the LR schedule for this world size (not yet ended at
    max_steps)."""
    order = backend.load_datasets()
    check_global_batch(config, ranks.world_size, order.num_samples)
    plan = SamplePlan(order.num_samples, config.batch_size, ranks.world_size, ranks.rank,
                      config.grad_accum_steps, config.seed, order=order)
    return plan, LRSchedule.from_config(config, ranks.world_size, plan.steps_per_epoch)


@dataclass(frozen=True)
class RunSetup:
    """What fit() set up before its first step, unchanged to its end (the schedule replaced as a whole)."""

    ranks: StartedRanks
    sample_plan: SamplePlan  # which samples this rank trains on, step by step
    data_order: dict[str, Any]  # what the plan's order depends on (a checkpoint's manifest keeps it)
    schedule: LRSchedule
    rng: RankRandomState  # this rank's RNG streams, seeded for it
    step_batches: StepBatches  # the step's batches, read from the backend's epoch stream
    ranks_averaged: int  # what the loss weights multiply back: the world size under Average, 1 under Sum
    meter: MetricAccumulator  # the log interval's training metrics
    epoch_means: RunningMean  # the epoch's reduced training metrics
    nonfinite: NonFiniteWatch  # the on_nan_loss policy, as the loop applies it after each reduction
    checkpoints: TrainerCheckpoints | None  # None: checkpointing is off
    callbacks: tuple[Callback, ...]  # the defaults then the user's, on this rank

    def schedule_step(self, state: TrainState) -> int:
        """The optimizer step the LR schedule is at: by epochs and steps of this world size."""
        return state.epoch * self.sample_plan.steps_per_epoch + state.step_in_epoch

    def ending_at_max_steps(self, max_steps: int | None, state: TrainState) -> RunSetup:
        """This setup with the schedule ended at `max_steps`, which counts the steps taken (also before a
        resume at another world size, where the schedule's steps are of the new size)."""
        if max_steps is None:
            return self
        end = self.schedule_step(state) + max(0, max_steps - state.step)
        schedule = dataclasses.replace(self.schedule, total_steps=min(self.schedule.total_steps, end))
        return dataclasses.replace(self, schedule=schedule)

    def rescheduled(self, config: TrainConfig, state: TrainState) -> RunSetup:
        """This setup with the schedule recomputed for `config`'s epochs and max_steps (another fit())."""
        schedule = LRSchedule.from_config(config, self.ranks.world_size, self.sample_plan.steps_per_epoch)
        return dataclasses.replace(self, schedule=schedule).ending_at_max_steps(config.max_steps, state)


class SetupFacts:
    """The run's facts as the loop shows them (to the trainer's read-only properties, the built-in callbacks
    by core/run_protocol.py's Run, and inference), read from the records `start_ranks` and prepare() make:
    a base of core/training_loop.py's TrainingLoop, which sets `_ranks` and `_setup`."""

    config: TrainConfig
    state: TrainState
    _ranks: StartedRanks | None  # start_ranks(): by fit(), or by a predict()/test() before it
    _setup: RunSetup | None  # prepare(): what the run set up before its first step

    def run_facts(self) -> RunFacts:
        """What the step-time table's advice depends on (core/step_times.py)."""
        c = self.config
        return RunFacts(controller=self.collectives.controller,
                        nodes=self.environment.describe(os.environ).num_nodes,
                        grad_allreduce=c.grad_allreduce, checkpoint_async=c.checkpoint_async,
                        zero_stage=c.zero_stage)

    @property
    def setup(self) -> RunSetup:
        """What fit() set up before its first step (`prepare`); an AttributeError before then."""
        if self._setup is None:
            raise AttributeError("the run's setup is made by fit(), before its first step: not yet")
        return self._setup

    @property
    def ranks(self) -> StartedRanks:
        """This process among the started ranks; an AttributeError before fit(), predict() or test()."""
        if self._ranks is None:
            raise AttributeError("the ranks are started by fit(), predict() or test(): not yet")
        return self._ranks

    @property
    def rank(self) -> int:
        """This rank's place in the job (0 before the ranks start)."""
        return self._ranks.rank if self._ranks is not None else 0

    @property
    def world_size(self) -> int:
        """The number of ranks (1 before they start)."""
        return self._ranks.world_size if self._ranks is not None else 1

    @property
    def local_rank(self) -> int:
        """This rank's place on its node (0 before the ranks start)."""
        return self._ranks.local_rank if self._ranks is not None else 0

    @property
    def collectives(self) -> Collectives:
        """The backend's collectives over all ranks."""
        return self.ranks.collectives

    @property
    def environment(self) -> Environment:
        """The environment that started this process."""
        return self.ranks.environment

    @property
    def schedule(self) -> LRSchedule:
        """The LR schedule, scaled for the global batch and ended at max_steps."""
        return self.setup.schedule

    @property
    def callbacks(self) -> list[Callback]:
        """The defaults then the user's, on this rank (none before fit() sets them up)."""
        return list(self._setup.callbacks) if self._setup is not None else []

    @property
    def checkpoints(self) -> TrainerCheckpoints | None:
        """The run's checkpoints; None while checkpointing is off (and before fit())."""
        return self._setup.checkpoints if self._setup is not None else None

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
        return self.setup.sample_plan.steps_per_epoch

    @property
    def schedule_step(self) -> int:
        """The optimizer step the LR schedule is at: by epochs and steps of the current world size."""
        return self.setup.schedule_step(self.state)
