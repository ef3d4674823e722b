"""How a run goes on: from a checkpoint (a resume: `continue_from`, once its pieces are loaded, reading back
what `run_manifest` wrote), or from the last fit() of the same trainer, in memory (fit again: `LastFit`,
`refuse_fit_again`, `fit_again`). The loop
(core/training_loop.py) calls these; each rank computes the same answer from the same values, so a refusal
is one ConfigError on every rank, before anything changes.
"""

from __future__ import annotations

import dataclasses
import platform
from dataclasses import dataclass
from typing import Any

from hvdazure._version import __version__
from hvdazure.core.checkpoint.trainer_checkpoints import ResumePoint, refuse_changed_data
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.rank_logging import logger
from hvdazure.core.run_setup import RunSetup
from hvdazure.core.sample_plan import SamplePlan
from hvdazure.core.seeds import RankRandomState, resume_seed
from hvdazure.core.state import TrainState

# What another fit() of the same trainer may change: how far the run goes, and what it profiles on the way
MAY_CHANGE_BETWEEN_FITS = ("epochs", "max_steps", "profile_steps")


@dataclass(frozen=True)
class LastFit:
    """How the last fit() of a trainer ended, and the config it ran with: `returned` is False while it runs
    and after it raised (an error, a stop signal): such a fit() is not continued."""

    returned: bool
    config: TrainConfig


def refuse_fit_again(last: LastFit, config: TrainConfig, state: TrainState, checkpointing: bool) -> None:
    """A ConfigError, before anything changes, for a fit() that cannot go on from the `last` one: after a
    fit() that raised, when the config changed elsewhere than `epochs`, `max_steps` and `profile_steps`, and
    when both `epochs` and `max_steps` are reached already."""
    c, s = config, state
    if not last.returned:
        again = " with resume=auto, to go on from its last checkpoint" if checkpointing else ""
        raise ConfigError(f"fit() cannot go on from this trainer's last fit(), which ended with an error "
                          f"or a stop signal at step {s.step}: create a new trainer{again}")
    if changed := [f.name for f in dataclasses.fields(c) if f.name not in MAY_CHANGE_BETWEEN_FITS
                   and getattr(c, f.name) != getattr(last.config, f.name)]:
        name = changed[0]
        raise ConfigError(f"config field {name!r}: {getattr(last.config, name)!r} -> {getattr(c, name)!r} "
                          "since the last fit(); another fit() of the same trainer goes on with its run "
                          "and may change epochs, max_steps and profile_steps only: for other "
                          "settings, create a new trainer (with resume=auto, to start from this run's "
                          "last checkpoint)")
    max_steps_reached = c.max_steps is not None and s.step >= c.max_steps
    if max_steps_reached or s.epoch >= c.epochs:
        field = "max_steps" if max_steps_reached else "epochs"
        done = f"{s.step} steps" if field == "max_steps" else f"{s.epoch} epochs"
        raise ConfigError(f"config field {field!r}: this trainer has trained its {done} already; to "
                          f"train further, raise {field} before calling fit() again: trainer.config = "
                          f"trainer.config.replace({field}=...)")


def fit_again(last: LastFit, config: TrainConfig, state: TrainState, setup: RunSetup) -> RunSetup:
    """What a later fit() on the same trainer does before its first step; returns the run's setup for it.
    The run goes on from where the `last` fit() left it, in memory (model, optimizer, RNG streams, data
    position, callbacks, history and the checkpoints, under the same run id), to the config's `epochs` and
    `max_steps`, with the LR schedule recomputed for them, as a resume from its last checkpoint would. A
    ConfigError on every rank, before anything changes, where it cannot (`refuse_fit_again`)."""
    c, s = config, state
    refuse_fit_again(last, c, s, setup.checkpoints is not None)
    s.should_stop, s.stop_requested, s.stop_reason = False, False, None  # as on a resume
    setup = setup.rescheduled(c, s)
    reopen_cut_epoch(s)
    s.lr = setup.schedule.lr_at(setup.schedule_step(s))
    until = f"epochs {c.epochs}" + (f", max_steps {c.max_steps}" if c.max_steps is not None else "")
    logger.info(f"fit() again: the run goes on from epoch {s.epoch + 1}, step {s.step}, to {until}")
    return setup


def reopen_cut_epoch(state: TrainState) -> None:
    """Drop the history record of an epoch cut short (max_steps, a stop): training goes on with it."""
    s = state
    if s.samples_in_epoch and s.history and s.history[-1]["epoch"] == s.epoch:
        s.history.pop()


def continue_from(point: ResumePoint, state: TrainState, plan: SamplePlan, rng: RankRandomState,
                  data_order: dict[str, Any], seed: int, rank: int, global_batch_size: int,
                  peak_lr: float) -> str:
    """What a resume means for this run, once the checkpoint's pieces are loaded: the data continues
    from the samples consumed in the epoch, whatever the world size was; the RNG streams are restored
    at the same world size, seeded afresh at another; returns the log line (with the LR rescale).
    `plan`, `rank`, `global_batch_size` and `peak_lr` are this run's, at its world size."""
    s, manifest, world_size = state, point.manifest, plan.world_size
    refuse_changed_data(point.url, manifest, data_order)
    reopen_cut_epoch(s)
    s.step_in_epoch = plan.steps_per_epoch - plan.steps_left(s.samples_in_epoch)
    old_world, old_batch = manifest["world_size"], manifest["global_batch_size"]
    if old_world == world_size and len(point.rngs) == world_size:
        rng.load_state_dict(point.rngs[rank])
    else:  # no saved RNG state belongs to this rank: a fresh, reproducible one
        rng.seed(resume_seed(seed, rank, s.step))
    message = (f"resumed from {point.name} at epoch {s.epoch + 1}, step {s.step} "
               f"({s.samples_in_epoch} samples into the epoch)")
    if (old_world, old_batch) != (world_size, global_batch_size):
        s.world_size_history.append({"step": s.step, "world_size": world_size,
                                     "global_batch_size": global_batch_size})
        message += (f"; world size {old_world} -> {world_size}, global batch {old_batch} -> "
                    f"{global_batch_size}: LR rescaled {manifest['scaled_lr']:.6g} -> {peak_lr:.6g}")
    return message


def run_manifest(reason: str, state: TrainState, config: TrainConfig, world_size: int, global_batch_size: int,
                 peak_lr: float, data_order: dict[str, Any], framework_name: str,
                 framework_versions: dict[str, str]) -> dict[str, Any]:
    """How a checkpoint of this step describes the run (manifest.json, beside the store's own keys): what
    a resume reads back (`continue_from`) and a person reads to know the run."""
    s = state
    metrics = {**{f"train_{k}": v for k, v in s.train_metrics.items()},
               **{f"eval_{k}": v for k, v in s.eval_metrics.items()}}
    return {
        "framework": framework_name, "reason": reason, "epoch": s.epoch,
        "step_in_epoch": s.step_in_epoch, "samples_in_epoch": s.samples_in_epoch,
        "samples_seen": s.samples_seen, "world_size": world_size,
        "global_batch_size": global_batch_size, "scaled_lr": peak_lr, "lr": s.lr,
        "metrics": metrics, "config": config.to_dict(), "world_size_history": s.world_size_history,
        **data_order,
        "versions": {"hvdazure": __version__, "python": platform.python_version(), **framework_versions},
    }
