"""The checks fit() makes before the first step, so that a setting that cannot train fails in seconds, with
one line on every rank naming the value: a global batch larger than the training set, a micro-batch smaller
than the model can train on, a validation_step that raises (the sanity check). Functions of what they are
given; the loop (core/training_loop.py) calls them in `prepare()`.
"""

from __future__ import annotations

from hvdazure.core.backend import Backend, DataError
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.metrics import MetricAccumulator
from hvdazure.core.sample_plan import SamplePlan
from hvdazure.core.seeds import RankRandomState

NO_EVAL_SAMPLES = "eval_dataset() holds no samples: return None for no evaluation"


def check_global_batch(config: TrainConfig, world_size: int, num_samples: int) -> None:
    """A ConfigError on every rank, before training, for a global batch larger than the training set:
    every epoch would be one short step, with the LR scaled for samples that are not there."""
    c, ranks = config, world_size
    if num_samples < 1:
        raise DataError("train_dataset() holds no samples: there is nothing to train on")
    batch = c.global_batch_size(ranks)
    if batch <= num_samples:
        return
    cells = ranks * c.grad_accum_steps  # micro-batches per step, all ranks together
    way = (f"use a batch_size of at most {num_samples // cells}" if num_samples >= cells else
           f"use fewer ranks or grad_accum_steps (ranks x grad_accum_steps at most {num_samples})")
    scaled = f", with the LR scaled for {batch}" if c.lr_scaling != "none" else ""
    raise ConfigError(
        f"config field 'batch_size': the global batch of {batch} samples ({c.batch_size} x {ranks} "
        f"rank(s) x {c.grad_accum_steps} grad_accum_steps) is larger than the {num_samples} training "
        f"samples: every epoch would be one step of {num_samples} samples{scaled}; {way}")


def check_micro_batch_sizes(config: TrainConfig, plan: SamplePlan, world_size: int, samples_in_epoch: int,
                            minimum: tuple[int, str, bool]) -> None:
    """A ConfigError on every rank, before training, if the plan gives some rank a micro-batch smaller
    than the model can train on (the short last step of an epoch, e.g. 1 sample for BatchNorm). `minimum`:
    the backend's min_samples_per_micro_batch() (samples, why, counted across ranks)."""
    need, why, across = minimum
    smallest = min(plan.smallest_micro_batch(0, across), plan.smallest_micro_batch(samples_in_epoch, across))
    if smallest >= need:
        return
    c = config
    fits = plan.nearest_batch_sizes(min_micro_batch=need, across_ranks=across)
    counted = " (all ranks together)" if across else ""
    raise ConfigError(
        f"config field 'batch_size': {c.batch_size} leaves a micro-batch of {smallest} sample(s)"
        f"{counted} in the last step of an epoch ({plan.num_samples} samples, global batch "
        f"{plan.global_batch_size} = {c.batch_size} x {world_size} rank(s) x "
        f"{c.grad_accum_steps} micro-batch(es)), and {why}; try batch_size {' or '.join(map(str, fits))}")


def check_validation_step(config: TrainConfig, backend: Backend, meter: MetricAccumulator,
                          rng: RankRandomState) -> None:
    """The sanity check (config field sanity_check): validation_step on one batch per rank before
    training, so that a broken one fails in seconds, not after an epoch. Nothing of it is kept: its
    metrics (in `meter`, a fresh one) are dropped unreduced (no collective), this rank's RNG streams are
    restored, and the backend leaves the model's mode as it was."""
    if not config.sanity_check:
        return
    streams = rng.state_dict()
    try:
        has_eval_data = backend.evaluate(meter, first_batch_only=True)
    except Exception as exc:
        if not isinstance(exc, ConfigError):  # a one-line error names the hook itself
            exc.add_note("hvdazure: raised while checking validation_step on one evaluation batch before "
                         "training (config field sanity_check: false skips this check)")
        raise
    rng.load_state_dict(streams)
    if has_eval_data and not meter.samples:
        raise DataError(NO_EVAL_SAMPLES)
