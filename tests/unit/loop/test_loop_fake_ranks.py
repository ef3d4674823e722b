"""The real training loop (core/trainer.py), callbacks and checkpoints, on 1..8 ranks simulated by threads.

The backend is a test double (tests/fakes/fake_backend.py): linear regression in float64 with exact SGD.
Its parameters are compared with `reference_sgd`, single-process SGD written from the documented policy
alone (step t takes the next global batch of the epoch's permutation; the gradient is the exact mean over
the step's samples), so sharding, loss weights, gradient averaging, LR and resume bookkeeping are all
checked against arithmetic, to 1e-12.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from fakes.fake_backend import (
    CollectiveMismatch,
    CollectiveTimeout,
    FakeTrainer,
    LinearProblem,
    ThreadWorld,
    initial_weights,
)

from hvdazure.core.callbacks import Callback
from hvdazure.core.checkpoint.store import CheckpointManager
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.sample_plan import epoch_permutation
from hvdazure.core.trainer import Trainer

Trainers = list[FakeTrainer]


# --- helpers ----------------------------------------------------------------------------------------------
def make_config(**fields: object) -> TrainConfig:
    return TrainConfig(**{"lr": 0.05, "progress_bar": False, **fields})  # type: ignore[arg-type]


def build(world_size: int, problem: LinearProblem, config: TrainConfig,
          callbacks: Callable[[int], Sequence[Callback]] = lambda rank: (), momentum: float = 0.0,
          trainer_class: type[FakeTrainer] = FakeTrainer) -> tuple[ThreadWorld, Trainers]:
    world = ThreadWorld(world_size)
    return world, [trainer_class(world, rank, problem, config, callbacks(rank), momentum)
                   for rank in range(world_size)]


def fit(world_size: int, problem: LinearProblem, config: TrainConfig, **options: object) -> Trainers:
    world, trainers = build(world_size, problem, config, **options)  # type: ignore[arg-type]
    world.run([trainer.fit for trainer in trainers])
    return trainers


def warmup_then_constant(lr: float, peak_lr: float, warmup_steps: int) -> Callable[[int], float]:
    """The LR of optimizer step t: a linear ramp from `lr` to `peak_lr`, then `peak_lr` (README)."""
    return lambda t: lr + (peak_lr - lr) * t / warmup_steps if t < warmup_steps else peak_lr


def reference_sgd(problem: LinearProblem, epochs: int, global_batch: int, lr_at: Callable[[int], float],
                  seed: int = 0, momentum: float = 0.0) -> tuple[np.ndarray, list[float]]:
    """Single-process SGD in the documented sample order: the final weights and each epoch's mean loss
    over its samples (each sample's loss taken before the step that trained on it)."""
    w, velocity, step, epoch_losses = initial_weights(problem.dim, seed, rank=0), 0.0, 0, []
    for epoch in range(epochs):
        order = epoch_permutation(problem.num_samples, seed, epoch)
        losses: list[float] = []
        for start in range(0, problem.num_samples, global_batch):
            batch = order[start : start + global_batch].tolist()
            losses.extend(problem.sample_losses(w, batch))
            velocity = momentum * velocity + problem.loss_and_gradient(w, batch)[1]
            w = w - lr_at(step) * velocity
            step += 1
        epoch_losses.append(float(np.mean(losses)))
    return w, epoch_losses


def samples_by_epoch(*runs: Trainers) -> dict[int, Counter]:
    """How many times each sample was trained on, per epoch, over all ranks of all `runs`."""
    used: dict[int, Counter] = defaultdict(Counter)
    for trainers in runs:
        for trainer in trainers:
            for step in trainer.steps:
                for indices in step.micro_batches:
                    used[step.epoch].update(indices)
    return dict(used)


def assert_each_sample_once_per_epoch(epochs: int, num_samples: int, *runs: Trainers) -> None:
    used = samples_by_epoch(*runs)
    assert sorted(used) == list(range(epochs))
    for epoch, counts in used.items():
        assert counts == Counter(range(num_samples)), f"epoch {epoch}"


def assert_same_on_every_rank(trainers: Trainers) -> None:
    for trainer in trainers[1:]:
        assert np.array_equal(trainer.weights, trainers[0].weights)
        assert trainer.state.history == trainers[0].state.history


class StopRequest(Callback):
    """Asks to stop (on the rank it is given to) at the end of optimizer step `at_step`."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.state.step == self.at_step:
            trainer.state.request_stop("asked by the test")


# --- one uninterrupted run, at many shapes ----------------------------------------------------------------
# (world size, grad_accum_steps, dataset size) with batch_size 2: one global batch exactly, one sample more
# (a last step of one sample: every cell but one left empty) and 21 more (partial last steps of 1 to 21
# samples, cells left empty). A global batch larger than the dataset is refused
# (test_checks_before_training.py).
SHAPES = [(world_size, grad_accum_steps, 2 * world_size * grad_accum_steps + extra)
          for world_size, grad_accum_steps, extra in itertools.product(range(1, 9), (1, 2, 3), (0, 1, 21))]
SHAPE_EPOCHS, SHAPE_EVAL_SAMPLES = 2, 7


@functools.cache
def shape_problem(num_samples: int) -> LinearProblem:
    return LinearProblem.make(num_samples, SHAPE_EVAL_SAMPLES)


def shape_config(world_size: int, grad_accum_steps: int) -> TrainConfig:
    # base_batch_size 4 and a 3-step warmup: the LR ramps from 0.02 to 0.02 x global batch / 4
    return make_config(epochs=SHAPE_EPOCHS, batch_size=2, grad_accum_steps=grad_accum_steps, lr=0.02,
                       base_batch_size=4, warmup_steps=3, log_every=3, checkpoint_dir=None)


@functools.cache
def trained_shape(world_size: int, grad_accum_steps: int, num_samples: int) -> tuple[FakeTrainer, ...]:
    """The trainers of one run per shape, shared by the tests that read them (each run takes milliseconds,
    but there are 72 of them)."""
    config = shape_config(world_size, grad_accum_steps)
    return tuple(fit(world_size, shape_problem(num_samples), config))


def reference_for_shape(world_size: int, grad_accum_steps: int,
                        num_samples: int) -> tuple[np.ndarray, list[float]]:
    config = shape_config(world_size, grad_accum_steps)
    global_batch = config.global_batch_size(world_size)
    lr_at = warmup_then_constant(0.02, 0.02 * global_batch / 4, 3)
    return reference_sgd(shape_problem(num_samples), SHAPE_EPOCHS, global_batch, lr_at)


@pytest.mark.parametrize(("world_size", "grad_accum_steps", "num_samples"), SHAPES)
def test_every_sample_is_trained_on_exactly_once_per_epoch(world_size: int, grad_accum_steps: int,
                                                            num_samples: int) -> None:
    trainers = list(trained_shape(world_size, grad_accum_steps, num_samples))

    assert_each_sample_once_per_epoch(SHAPE_EPOCHS, num_samples, trainers)


@pytest.mark.parametrize(("world_size", "grad_accum_steps", "num_samples"), SHAPES)
def test_parameters_equal_single_process_sgd_over_the_same_global_batches(
        world_size: int, grad_accum_steps: int, num_samples: int) -> None:
    trainers = trained_shape(world_size, grad_accum_steps, num_samples)
    expected, _ = reference_for_shape(world_size, grad_accum_steps, num_samples)

    np.testing.assert_allclose(trainers[0].weights, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("world_size", "grad_accum_steps", "num_samples"), SHAPES)
def test_parameters_and_history_are_identical_on_every_rank(world_size: int, grad_accum_steps: int,
                                                           num_samples: int) -> None:
    assert_same_on_every_rank(list(trained_shape(world_size, grad_accum_steps, num_samples)))


@pytest.mark.parametrize(("world_size", "grad_accum_steps", "num_samples"), SHAPES)
def test_the_epoch_train_loss_is_the_mean_over_every_sample_of_the_epoch(
        world_size: int, grad_accum_steps: int, num_samples: int) -> None:
    trainers = trained_shape(world_size, grad_accum_steps, num_samples)
    _, epoch_losses = reference_for_shape(world_size, grad_accum_steps, num_samples)

    reported = [record["train_loss"] for record in trainers[0].state.history]
    np.testing.assert_allclose(reported, epoch_losses, rtol=1e-12)


@pytest.mark.parametrize(("world_size", "grad_accum_steps", "num_samples"), SHAPES)
def test_history_has_one_record_per_epoch_counting_every_sample(world_size: int, grad_accum_steps: int,
                                                               num_samples: int) -> None:
    trainers = trained_shape(world_size, grad_accum_steps, num_samples)
    steps_per_epoch = -(-num_samples // (2 * world_size * grad_accum_steps))

    history = trainers[0].state.history
    assert [r["epoch"] for r in history] == list(range(SHAPE_EPOCHS))
    assert [r["samples_seen"] for r in history] == [num_samples * (e + 1) for e in range(SHAPE_EPOCHS)]
    assert [r["step"] for r in history] == [steps_per_epoch * (e + 1) for e in range(SHAPE_EPOCHS)]
    assert trainers[0].state.samples_seen == SHAPE_EPOCHS * num_samples


@pytest.mark.parametrize(("world_size", "grad_accum_steps", "num_samples"), SHAPES)
def test_the_lr_of_every_step_is_the_warmup_ramp_then_the_scaled_lr(world_size: int, grad_accum_steps: int,
                                                                    num_samples: int) -> None:
    trainers = trained_shape(world_size, grad_accum_steps, num_samples)
    lr_at = warmup_then_constant(0.02, 0.02 * (2 * world_size * grad_accum_steps) / 4, 3)

    for trainer in trainers:
        assert [s.lr for s in trainer.steps] == pytest.approx([lr_at(s.step) for s in trainer.steps],
                                                              rel=1e-15)


@pytest.mark.parametrize(("world_size", "grad_accum_steps", "num_samples"), SHAPES)
def test_every_rank_runs_every_step_and_skips_the_forward_pass_of_an_empty_micro_batch(
        world_size: int, grad_accum_steps: int, num_samples: int) -> None:
    trainers = trained_shape(world_size, grad_accum_steps, num_samples)

    assert len({len(t.steps) for t in trainers}) == 1  # each took part in every gradient average
    for trainer in trainers:
        cells = [(i, w) for s in trainer.steps for i, w in zip(s.micro_batches, s.loss_weights, strict=True)]
        assert trainer.forward_passes == sum(1 for indices, _ in cells if indices)
        assert all((weight is None) == (not indices) for indices, weight in cells)


def test_the_shapes_include_micro_batches_left_empty() -> None:
    trainers = trained_shape(8, 1, 17)  # a global batch of 16, then 1 sample for 8 ranks

    assert any(not indices for t in trainers for s in t.steps for indices in s.micro_batches)


@pytest.mark.parametrize(("world_size", "grad_accum_steps", "num_samples"), SHAPES)
def test_eval_loss_equals_the_loss_over_the_whole_eval_set(world_size: int, grad_accum_steps: int,
                                                           num_samples: int) -> None:
    trainers = trained_shape(world_size, grad_accum_steps, num_samples)  # 7 eval samples: some ranks none
    problem = shape_problem(num_samples)

    expected = np.mean(problem.sample_losses(trainers[0].weights, range(SHAPE_EVAL_SAMPLES), eval_set=True))
    assert trainers[0].state.history[-1]["eval_loss"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("world_size", [*range(1, 9), 49])  # 49: 1/49 x 49 is not 1.0 in floating point
def test_a_full_step_has_loss_weight_exactly_one_at_any_world_size(world_size: int) -> None:
    problem = LinearProblem.make(7 * world_size * 3 + 4)  # 3 full steps, then a short one
    trainers = fit(world_size, problem, make_config(batch_size=7))

    for trainer in trainers:
        full_steps = [s for s in trainer.steps if sum(map(len, s.micro_batches)) == 7]
        assert len(full_steps) == 3
        assert all(s.loss_weights == [1.0] for s in full_steps)


# --- length of training, evaluation, stops ----------------------------------------------------------------
@pytest.mark.parametrize(("world_size", "grad_accum_steps", "max_steps"), [(1, 1, 1), (2, 1, 5), (3, 2, 4),
                                                                           (7, 3, 2), (4, 1, 7)])
def test_max_steps_counts_optimizer_steps_taken(world_size: int, grad_accum_steps: int,
                                                max_steps: int) -> None:
    problem = LinearProblem.make(45)
    config = make_config(epochs=10, batch_size=2, grad_accum_steps=grad_accum_steps, max_steps=max_steps)
    trainers = fit(world_size, problem, config)

    trained = sum(map(len, itertools.chain.from_iterable(s.micro_batches for t in trainers for s in t.steps)))
    assert [len(t.steps) for t in trainers] == [max_steps] * world_size
    assert trainers[0].state.step == max_steps
    assert trainers[0].state.samples_seen == trained
    assert trainers[0].state.history[-1]["samples_seen"] == trained


def test_evaluation_runs_every_eval_every_epochs_and_after_the_last() -> None:
    problem = LinearProblem.make(12, num_eval=5)
    trainers = fit(3, problem, make_config(epochs=5, batch_size=2, eval_every=2))

    evaluated = [r["epoch"] for r in trainers[0].state.history if "eval_loss" in r]
    assert evaluated == [1, 3, 4]


def test_a_run_ended_by_max_steps_mid_epoch_is_evaluated_and_logs_the_epoch_as_cut_short(
        rank0_log: list[str]) -> None:
    problem = LinearProblem.make(12, num_eval=5)
    trainers = fit(2, problem, make_config(epochs=5, batch_size=2, eval_every=3, max_steps=4))

    assert [("eval_loss" in r) for r in trainers[0].state.history] == [False, True]
    epoch_ends = [line.split(":")[0] for line in rank0_log if line.startswith("epoch ") and ":" in line]
    assert epoch_ends == ["epoch 1 done", "epoch 2 cut short at step 1 of 3 (max_steps 4)"]


@pytest.mark.parametrize(("world_size", "requesting_rank", "at_step", "log_every", "stops_at"), [
    (1, 0, 5, 1, 6),  # the request goes out with the next step's metric reduction
    (3, 2, 4, 3, 6),  # ... which comes every log_every steps
    (3, 1, 6, 3, 9),  # a request made just after a reduction waits for the next one
    (8, 5, 1, 10, 4),  # ... or for the end of the epoch (4 steps of 16 samples), whichever comes first
])
def test_a_stop_requested_on_one_rank_stops_every_rank_at_the_same_step(
        world_size: int, requesting_rank: int, at_step: int, log_every: int, stops_at: int) -> None:
    problem = LinearProblem.make(60)
    config = make_config(epochs=3, batch_size=2, log_every=log_every)
    trainers = fit(world_size, problem, config,
                   callbacks=lambda rank: [StopRequest(at_step)] if rank == requesting_rank else [])

    assert [t.state.step for t in trainers] == [stops_at] * world_size
    assert [len(t.steps) for t in trainers] == [stops_at] * world_size
    reasons = {t.rank: t.state.stop_reason for t in trainers}
    assert reasons.pop(requesting_rank) == "asked by the test"
    assert set(reasons.values()) <= {"stop requested by another rank"}
    assert_same_on_every_rank(trainers)


def test_early_stopping_stops_every_rank_after_patience_evaluations_without_improvement() -> None:
    problem = LinearProblem.make(20, num_eval=9)
    # the eval loss falls, so in "max" mode it never improves after the first evaluation
    config = make_config(epochs=10, batch_size=2, monitor="eval_loss", monitor_mode="max",
                         early_stopping_patience=2)
    trainers = fit(3, problem, config)

    assert [len(t.state.history) for t in trainers] == [3, 3, 3]
    assert all(t.state.should_stop for t in trainers)
    assert_same_on_every_rank(trainers)


class ParityMetrics(FakeTrainer):
    """Even ranks report `even_index`, odd ranks `odd_index`: the mean sample index of the micro-batch."""

    def training_metrics(self, indices: list[int]) -> dict[str, float]:
        return {"odd_index" if self.rank % 2 else "even_index": float(np.mean(indices))}


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_a_metric_reported_on_some_ranks_is_averaged_over_the_samples_that_reported_it(
        world_size: int) -> None:
    problem = LinearProblem.make(37)
    config = make_config(epochs=1, batch_size=3, log_every=2)
    trainers = fit(world_size, problem, config, trainer_class=ParityMetrics)

    def mean_index(parity: int) -> float:
        return float(np.mean([i for t in trainers if t.rank % 2 == parity
                              for s in t.steps for indices in s.micro_batches for i in indices]))

    record = trainers[0].state.history[0]
    assert record["train_even_index"] == pytest.approx(mean_index(0), rel=1e-12)
    assert record["train_odd_index"] == pytest.approx(mean_index(1), rel=1e-12)
    lr_at = warmup_then_constant(0.05, 0.05 * world_size, 0)
    _, epoch_losses = reference_sgd(problem, 1, 3 * world_size, lr_at)
    assert record["train_loss"] == pytest.approx(epoch_losses[0], rel=1e-12)


# --- checkpoints and resume -------------------------------------------------------------------------------
PAIRS = list(itertools.product(range(1, 5), repeat=2))  # (world size before, world size after the resume)
RESUME_EPOCHS, RESUME_SAMPLES = 3, 29


def first_run_ends(how: str, world_size: int, steps_per_epoch: int) -> tuple[dict, Callable]:
    """Config fields and callbacks that end a first run mid-way through its second epoch (which has at
    least 3 steps): after its first step, or after its second when a stop request waits for the next
    metric reduction."""
    at_step = steps_per_epoch + 1
    if how == "max_steps":
        return {"max_steps": at_step}, lambda rank: ()
    # a stop request on the last rank, after a periodic checkpoint
    return {"checkpoint_every_steps": 3, "log_every": 1}, \
        lambda rank: [StopRequest(at_step)] if rank == world_size - 1 else []


@pytest.mark.parametrize("how", ["max_steps", "stop_request"])
@pytest.mark.parametrize(("first_world", "second_world"), PAIRS)
def test_a_run_resumed_at_another_world_size_trains_every_sample_of_every_epoch_once(
        first_world: int, second_world: int, how: str, checkpoint_dir: str) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    config = make_config(epochs=RESUME_EPOCHS, batch_size=3, checkpoint_dir=checkpoint_dir, log_every=2)
    ends, callbacks = first_run_ends(how, first_world, -(-RESUME_SAMPLES // (3 * first_world)))
    first = fit(first_world, problem, config.replace(**ends), callbacks=callbacks)
    assert first[0].state.epoch == 1 and first[0].state.samples_in_epoch > 0  # stopped mid-epoch

    second = fit(second_world, problem, config.replace(resume="auto"))

    assert_each_sample_once_per_epoch(RESUME_EPOCHS, RESUME_SAMPLES, first, second)
    history = second[0].state.history
    assert [r["epoch"] for r in history] == list(range(RESUME_EPOCHS))
    assert [r["samples_seen"] for r in history] == [RESUME_SAMPLES * (e + 1) for e in range(RESUME_EPOCHS)]
    assert second[0].state.samples_seen == RESUME_EPOCHS * RESUME_SAMPLES
    assert_same_on_every_rank(second)


GLOBAL_BATCH = 12  # batch_size x world size, the same at every world size in 1..4
EXACT_LR, EXACT_MOMENTUM = 0.05, 0.9


def exact_config(world_size: int, checkpoint_dir: str) -> TrainConfig:
    # base_batch_size 6: the LR ramps over 4 steps from 0.05 to 0.1, the same at every world size
    return make_config(epochs=RESUME_EPOCHS, batch_size=GLOBAL_BATCH // world_size, lr=EXACT_LR,
                       base_batch_size=6, warmup_steps=4, checkpoint_dir=checkpoint_dir, log_every=2)


@functools.cache
def uninterrupted() -> tuple[np.ndarray, list[float]]:
    lr_at = warmup_then_constant(EXACT_LR, 2 * EXACT_LR, 4)
    return reference_sgd(LinearProblem.make(RESUME_SAMPLES), RESUME_EPOCHS, GLOBAL_BATCH, lr_at,
                         momentum=EXACT_MOMENTUM)


def resumed_with_the_same_global_batch(first_world: int, second_world: int, how: str,
                                       checkpoint_dir: str) -> tuple[Trainers, Trainers]:
    problem = LinearProblem.make(RESUME_SAMPLES)
    ends, callbacks = first_run_ends(how, first_world, -(-RESUME_SAMPLES // GLOBAL_BATCH))
    first = fit(first_world, problem, exact_config(first_world, checkpoint_dir).replace(**ends),
                callbacks=callbacks, momentum=EXACT_MOMENTUM)
    second = fit(second_world, problem, exact_config(second_world, checkpoint_dir).replace(resume="auto"),
                 momentum=EXACT_MOMENTUM)
    return first, second


@pytest.mark.parametrize("how", ["max_steps", "stop_request"])
@pytest.mark.parametrize(("first_world", "second_world"), PAIRS)
def test_a_resume_with_the_same_global_batch_ends_with_the_parameters_of_an_uninterrupted_run(
        first_world: int, second_world: int, how: str, checkpoint_dir: str) -> None:
    _, second = resumed_with_the_same_global_batch(first_world, second_world, how, checkpoint_dir)

    np.testing.assert_allclose(second[0].weights, uninterrupted()[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize(("first_world", "second_world"), [(1, 4), (4, 1), (2, 3)])
def test_a_resume_with_the_same_global_batch_continues_the_lr_schedule_and_the_epoch_metrics(
        first_world: int, second_world: int, checkpoint_dir: str) -> None:
    first, second = resumed_with_the_same_global_batch(first_world, second_world, "max_steps",
                                                       checkpoint_dir)

    lr_at = warmup_then_constant(EXACT_LR, 2 * EXACT_LR, 4)
    lrs = [s.lr for s in first[0].steps + second[0].steps]
    assert lrs == pytest.approx([lr_at(t) for t in range(len(lrs))], rel=1e-15)
    reported = [r["train_loss"] for r in second[0].state.history]
    np.testing.assert_allclose(reported, uninterrupted()[1], rtol=1e-12)


@pytest.mark.parametrize(("first_world", "second_world"), [(1, 3), (2, 4), (4, 2), (3, 1)])
def test_max_steps_of_a_resumed_run_counts_the_steps_taken_before_it(first_world: int, second_world: int,
                                                                     checkpoint_dir: str) -> None:
    problem = LinearProblem.make(100)
    config = make_config(epochs=2, batch_size=2, checkpoint_dir=checkpoint_dir)
    fit(first_world, problem, config.replace(max_steps=3))

    second = fit(second_world, problem, config.replace(max_steps=7, resume="auto"))

    assert [len(t.steps) for t in second] == [4] * second_world
    assert second[0].state.step == 7
    assert second[0].state.samples_seen == 3 * 2 * first_world + 4 * 2 * second_world


@pytest.mark.parametrize(("first_world", "second_world"), [(2, 4), (3, 1)])
def test_a_resume_after_the_last_epoch_trains_nothing_more_and_says_so(
        first_world: int, second_world: int, checkpoint_dir: str, rank0_log: list[str]) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    config = make_config(epochs=2, batch_size=3, checkpoint_dir=checkpoint_dir)
    first = fit(first_world, problem, config)

    rank0_log.clear()
    second = fit(second_world, problem, config.replace(resume="auto"))

    said = "nothing to train: the run has trained its 2 epochs already"
    assert any(line.startswith(said) for line in rank0_log), rank0_log
    assert [len(t.steps) for t in second] == [0] * second_world
    assert second[0].state.history == first[0].state.history
    np.testing.assert_array_equal(second[0].weights, first[0].weights)


def test_a_resume_at_the_same_world_size_continues_each_rank_s_random_stream(checkpoint_dir: str) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    config = make_config(epochs=2, batch_size=2, checkpoint_dir=checkpoint_dir)
    whole = fit(3, problem, config.replace(checkpoint_dir=None))
    first = fit(3, problem, config.replace(max_steps=4))
    second = fit(3, problem, config.replace(resume="auto"))

    for rank in range(3):
        draws = [s.random_draw for s in first[rank].steps + second[rank].steps]
        assert draws == [s.random_draw for s in whole[rank].steps]


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_checkpoint_hash_chooses_the_manifest_s_records_and_the_resume_is_exact(checkpoint_dir: str,
                                                                                algorithm: str) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    config = make_config(epochs=2, batch_size=2, checkpoint_dir=checkpoint_dir, checkpoint_hash=algorithm,
                         checkpoint_every_steps=2)
    whole = fit(2, problem, config.replace(checkpoint_dir=None))
    fit(2, problem, config.replace(max_steps=5))
    manifests = [c.manifest for c in CheckpointManager(checkpoint_dir).checkpoints()]
    second = fit(2, problem, config.replace(resume="auto"))

    assert manifests and all(set(record) == {algorithm, "bytes"}
                             for m in manifests for record in m["files"].values())
    assert {m["format_version"] for m in manifests} == {1 if algorithm == "sha256" else 2}
    np.testing.assert_array_equal(second[0].weights, whole[0].weights)


class Signal(Callback):
    """SIGTERM arrives on the rank it is given to, at the start of optimizer step `at_step` (0-based)."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_step_begin(self, trainer: Trainer) -> None:
        if trainer.state.step == self.at_step:
            trainer.receive_signal(signal.SIGTERM)  # type: ignore[attr-defined]


def test_a_signal_on_one_rank_stops_every_rank_at_the_same_step_with_a_checkpoint_and_exit_143(
        tmp_path: Path) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    config = exact_config(3, str(tmp_path))
    world, trainers = build(3, problem, config, callbacks=lambda rank: [Signal(4)] if rank == 2 else [],
                            momentum=EXACT_MOMENTUM)

    with pytest.raises(SystemExit) as stopped:
        world.run([trainer.fit for trainer in trainers])

    assert stopped.value.code == 128 + signal.SIGTERM
    assert [t.state.step for t in trainers] == [5, 5, 5]  # the step that voted was finished
    checkpoint, _ = CheckpointManager(str(tmp_path)).latest_valid()
    assert checkpoint is not None and checkpoint.step == 5


class PreemptionNotice(Callback):
    """A watcher thread on this rank calls request_checkpoint_and_exit during optimizer step `at_step`."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_step_begin(self, trainer: Trainer) -> None:
        if trainer.state.step == self.at_step:
            watcher = threading.Thread(target=trainer.request_checkpoint_and_exit,
                                       args=("preemption notice for this VM",))
            watcher.start()
            watcher.join()


def test_a_checkpoint_and_exit_requested_from_a_thread_of_rank_0_stops_every_rank_with_a_checkpoint(
        tmp_path: Path) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    world, trainers = build(3, problem, exact_config(3, str(tmp_path)), momentum=EXACT_MOMENTUM,
                            callbacks=lambda rank: [PreemptionNotice(4)] if rank == 0 else [])

    with pytest.raises(SystemExit) as stopped:
        world.run([trainer.fit for trainer in trainers])

    assert stopped.value.code == 128 + signal.SIGTERM
    assert [t.state.step for t in trainers] == [5, 5, 5]
    checkpoint, _ = CheckpointManager(str(tmp_path)).latest_valid()
    assert checkpoint is not None and checkpoint.step == 5
    assert checkpoint.manifest["reason"] == "signal: preemption notice for this VM"


@pytest.mark.parametrize("at_step", [4, 5])  # mid-epoch; the last step of an epoch (3 steps per epoch)
def test_a_run_stopped_by_a_signal_resumes_to_the_parameters_of_an_uninterrupted_run(tmp_path: Path,
                                                                                    at_step: int) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    world, trainers = build(3, problem, exact_config(3, str(tmp_path)), momentum=EXACT_MOMENTUM,
                            callbacks=lambda rank: [Signal(at_step)] if rank == 0 else [])
    with pytest.raises(SystemExit):
        world.run([trainer.fit for trainer in trainers])

    second = fit(2, problem, exact_config(2, str(tmp_path)).replace(resume="auto"), momentum=EXACT_MOMENTUM)

    assert_each_sample_once_per_epoch(RESUME_EPOCHS, RESUME_SAMPLES, trainers, second)
    np.testing.assert_allclose(second[0].weights, uninterrupted()[0], rtol=0, atol=1e-12)


class Crash(Callback):
    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.state.step == self.at_step:
            raise RuntimeError("rank lost")


def test_after_an_error_on_another_rank_rank_0_s_checkpoint_resumes_the_run_exactly(tmp_path: Path) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    world, trainers = build(2, problem, exact_config(2, str(tmp_path)), momentum=EXACT_MOMENTUM,
                            callbacks=lambda rank: [Crash(4)] if rank == 1 else [])
    with pytest.raises(RuntimeError, match="rank lost"):
        world.run([trainer.fit for trainer in trainers])

    second = fit(4, problem, exact_config(4, str(tmp_path)).replace(resume="auto"), momentum=EXACT_MOMENTUM)

    assert_each_sample_once_per_epoch(RESUME_EPOCHS, RESUME_SAMPLES, trainers, second)
    np.testing.assert_allclose(second[0].weights, uninterrupted()[0], rtol=0, atol=1e-12)


# --- the fake itself: what would hang a real job fails here at once ---------------------------------------
def test_fake_different_collectives_at_the_same_position_fail_instead_of_hanging() -> None:
    world = ThreadWorld(2, timeout=5)

    with pytest.raises(CollectiveMismatch, match="collective #1 differs"):
        world.run([lambda: [world.exchange(0, "allgather_bytes", "bytes", b"") for _ in range(2)],
                   lambda: [world.exchange(1, "allgather_bytes", "bytes", b""),
                            world.exchange(1, "broadcast_bytes", "bytes", b"")]])


def test_fake_an_exception_on_one_rank_fails_the_run_and_releases_the_others() -> None:
    world = ThreadWorld(3, timeout=5)

    def fail() -> None:
        raise ValueError("broken rank")

    with pytest.raises(ValueError, match="broken rank"):
        world.run([lambda: world.exchange(0, "allgather_bytes", "bytes", b""), fail,
                   lambda: world.exchange(2, "allgather_bytes", "bytes", b"")])


def test_fake_a_rank_that_finishes_while_others_wait_for_it_fails_the_run() -> None:
    world = ThreadWorld(2, timeout=5)

    with pytest.raises(CollectiveMismatch, match=r"rank\(s\) \[1\] finished"):
        world.run([lambda: world.exchange(0, "allgather_bytes", "bytes", b""), lambda: None])


def test_fake_a_wait_longer_than_the_timeout_fails_the_run() -> None:
    world = ThreadWorld(2, timeout=0.1)

    def late() -> None:  # enters no collective until rank 0's wait has failed
        while not world.aborted:
            time.sleep(0.01)

    with pytest.raises(CollectiveTimeout, match="waited"):
        world.run([lambda: world.exchange(0, "allgather_bytes", "bytes", b""), late])


# --- fit() again on the same trainer: the same run goes on ------------------------------------------------
def fit_again(world_size: int, problem: LinearProblem, config: TrainConfig,
              then: Callable[[FakeTrainer], object], momentum: float = 0.0) -> Trainers:
    """One world whose ranks each call fit(), `then(trainer)` (e.g. raising epochs), and fit() again."""
    world, trainers = build(world_size, problem, config, momentum=momentum)

    def twice(trainer: FakeTrainer) -> None:
        trainer.fit()
        then(trainer)
        trainer.fit()

    world.run([lambda t=t: twice(t) for t in trainers])
    return trainers


def raise_to(**fields: object) -> Callable[[FakeTrainer], None]:
    def change(trainer: FakeTrainer) -> None:
        trainer.config = trainer.config.replace(**fields)

    return change


@pytest.mark.parametrize("world_size", [1, 3])
def test_a_second_fit_with_more_epochs_ends_with_the_parameters_and_history_of_one_longer_fit(
        world_size: int, tmp_path: Path) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    config = exact_config(world_size, str(tmp_path))
    trainers = fit_again(world_size, problem, config.replace(epochs=1), raise_to(epochs=RESUME_EPOCHS),
                         momentum=EXACT_MOMENTUM)

    np.testing.assert_allclose(trainers[0].weights, uninterrupted()[0], rtol=0, atol=1e-12)
    assert [r["epoch"] for r in trainers[0].state.history] == list(range(RESUME_EPOCHS))
    np.testing.assert_allclose([r["train_loss"] for r in trainers[0].state.history], uninterrupted()[1],
                               rtol=1e-12)
    lr_at = warmup_then_constant(EXACT_LR, 2 * EXACT_LR, 4)
    assert [s.lr for s in trainers[0].steps] == pytest.approx([lr_at(s.step) for s in trainers[0].steps],
                                                              rel=1e-15)
    assert_each_sample_once_per_epoch(RESUME_EPOCHS, RESUME_SAMPLES, trainers)
    assert_same_on_every_rank(trainers)


def test_a_second_fit_after_max_steps_mid_epoch_goes_on_as_if_uninterrupted(tmp_path: Path) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    config = exact_config(2, str(tmp_path))
    trainers = fit_again(2, problem, config.replace(max_steps=4), raise_to(max_steps=None),
                         momentum=EXACT_MOMENTUM)

    np.testing.assert_allclose(trainers[0].weights, uninterrupted()[0], rtol=0, atol=1e-12)
    assert [r["epoch"] for r in trainers[0].state.history] == list(range(RESUME_EPOCHS))  # no cut record
    assert_each_sample_once_per_epoch(RESUME_EPOCHS, RESUME_SAMPLES, trainers)


def test_a_second_fit_schedules_the_lr_as_a_resume_of_its_last_checkpoint_would(tmp_path: Path) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    cosine = make_config(epochs=1, batch_size=3, schedule="cosine", warmup_steps=2, log_every=2)
    again = fit_again(2, problem, cosine.replace(checkpoint_dir=str(tmp_path / "again")), raise_to(epochs=3))
    fit(2, problem, cosine.replace(checkpoint_dir=str(tmp_path / "resumed")))
    resumed = fit(2, problem, cosine.replace(checkpoint_dir=str(tmp_path / "resumed"), epochs=3,
                                            resume="auto"))

    assert [s.lr for s in again[0].steps][-len(resumed[0].steps):] == [s.lr for s in resumed[0].steps]
    np.testing.assert_array_equal(again[0].weights, resumed[0].weights)
    assert again[0].state.history == resumed[0].state.history


def test_a_second_fit_continues_the_checkpoints_of_the_first_as_one_run(tmp_path: Path) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    config = make_config(epochs=1, batch_size=3, checkpoint_dir=str(tmp_path), keep_last=5)
    trainers = fit_again(2, problem, config, raise_to(epochs=3))

    checkpoints = CheckpointManager(str(tmp_path)).checkpoints()
    steps_per_epoch = trainers[0].steps_per_epoch
    assert [c.name for c in checkpoints] == [f"step-{e * steps_per_epoch:08d}" for e in (1, 2, 3)]
    assert len({c.run_id for c in checkpoints}) == 1 and checkpoints[0].run_id
    assert (tmp_path / "latest").read_text().strip() == checkpoints[-1].name


def _errors_of_fit_again(world_size: int, config: TrainConfig, then: Callable[[FakeTrainer], object],
                         callbacks: Callable[[int], Sequence[Callback]] = lambda rank: ()) -> tuple[
                             dict[int, BaseException], Trainers]:
    """Each rank's exception from the second fit() (the first is allowed to fail, as after a crash)."""
    world, trainers = build(world_size, LinearProblem.make(RESUME_SAMPLES), config, callbacks=callbacks)
    errors: dict[int, BaseException] = {}

    def twice(trainer: FakeTrainer) -> None:
        with contextlib.suppress(RuntimeError):
            trainer.fit()
        then(trainer)
        try:
            trainer.fit()
        except ConfigError as exc:
            errors[trainer.rank] = exc

    world.run([lambda t=t: twice(t) for t in trainers])
    return errors, trainers


@pytest.mark.parametrize(("then", "field", "says"), [
    (lambda trainer: None, "epochs", "raise epochs before calling fit() again"),
    (raise_to(max_steps=6), "max_steps", "raise max_steps before calling fit() again"),
    (raise_to(epochs=4, lr=0.01), "lr", "may change epochs, max_steps and profile_steps only"),
])
def test_a_second_fit_with_nothing_left_to_train_or_another_setting_is_refused_in_one_line_on_every_rank(
        then: Callable[[FakeTrainer], object], field: str, says: str) -> None:
    config = make_config(epochs=2, batch_size=3, max_steps=6 if field == "max_steps" else None)
    errors, trainers = _errors_of_fit_again(2, config, then)

    assert sorted(errors) == [0, 1] and len({str(e) for e in errors.values()}) == 1
    message = str(errors[0])
    assert message.startswith(f"config field {field!r}") and says in message and "\n" not in message
    assert [len(t.steps) for t in trainers] == [len(trainers[0].steps)] * 2  # nothing more trained


def test_a_second_fit_after_a_fit_that_raised_is_refused_naming_resume_auto(tmp_path: Path) -> None:
    config = make_config(epochs=3, batch_size=3, checkpoint_dir=str(tmp_path))
    errors, _ = _errors_of_fit_again(2, config, raise_to(epochs=4),
                                     callbacks=lambda rank: [Crash(4)] if rank == 1 else [])

    assert sorted(errors) == [0, 1]
    assert "ended with an error or a stop signal at step" in str(errors[0])
    assert "resume=auto" in str(errors[0])


# --- one run per checkpoint directory ---------------------------------------------------------------------
def _errors_of_fit(world_size: int, config: TrainConfig) -> tuple[dict[int, BaseException], Trainers]:
    """Each rank's ConfigError from fit(), if it raised one."""
    world, trainers = build(world_size, LinearProblem.make(RESUME_SAMPLES), config)
    errors: dict[int, BaseException] = {}

    def run(trainer: FakeTrainer) -> None:
        try:
            trainer.fit()
        except ConfigError as exc:
            errors[trainer.rank] = exc

    world.run([lambda t=t: run(t) for t in trainers])
    return errors, trainers


def _stored(directory: Path) -> dict[str, bytes]:
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    return {str(p.relative_to(directory)): p.read_bytes() for p in files}


def _run_ids(directory: str | Path) -> list[str | None]:
    return [c.run_id for c in CheckpointManager(str(directory)).checkpoints()]


def test_a_fresh_run_into_a_directory_holding_another_run_is_refused_on_every_rank_before_its_first_step(
        tmp_path: Path) -> None:
    config = make_config(epochs=2, batch_size=3, checkpoint_dir=str(tmp_path))
    fit(2, LinearProblem.make(RESUME_SAMPLES), config)
    before = _stored(tmp_path)

    errors, trainers = _errors_of_fit(2, config.replace(epochs=1))

    assert sorted(errors) == [0, 1] and len({str(e) for e in errors.values()}) == 1
    message = str(errors[0])
    assert message.startswith(f"config field 'checkpoint_dir': {tmp_path} holds the checkpoints of another "
                              f"run (run {_run_ids(tmp_path)[-1]}, newest step-")
    assert "resume=auto" in message and "new checkpoint_dir" in message and "\n" not in message
    assert errors[0].exit_status == 2  # type: ignore[attr-defined]
    assert [len(t.steps) for t in trainers] == [0, 0]
    assert _stored(tmp_path) == before  # nothing written, nothing deleted


def test_every_checkpoint_of_a_run_records_its_run_id_kept_across_resumes_at_other_world_sizes(
        tmp_path: Path) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    config = make_config(epochs=3, batch_size=3, checkpoint_dir=str(tmp_path), keep_last=10,
                         checkpoint_every_steps=2)
    fit(2, problem, config.replace(max_steps=5))
    first = set(_run_ids(tmp_path))
    fit(3, problem, config.replace(max_steps=9, resume="auto"))
    fit(1, problem, config.replace(resume="auto"))

    assert len(first) == 1 and None not in first
    assert set(_run_ids(tmp_path)) == first and len(_run_ids(tmp_path)) > 4


def test_a_resume_from_a_checkpoint_path_keeps_its_run_id_in_a_new_directory(tmp_path: Path) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    config = make_config(epochs=2, batch_size=3, checkpoint_dir=str(tmp_path / "a"))
    fit(2, problem, config.replace(max_steps=3))
    resumed_from = CheckpointManager(str(tmp_path / "a")).checkpoints()[-1]

    fit(1, problem, config.replace(checkpoint_dir=str(tmp_path / "b"), resume=resumed_from.url))

    assert set(_run_ids(tmp_path / "b")) == {resumed_from.run_id}


def test_a_resume_from_elsewhere_into_a_directory_holding_another_run_is_refused_on_every_rank(
        tmp_path: Path) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    config = make_config(epochs=2, batch_size=3)
    fit(1, problem, config.replace(checkpoint_dir=str(tmp_path / "a"), max_steps=3))
    fit(1, problem, config.replace(checkpoint_dir=str(tmp_path / "b"), max_steps=3))
    elsewhere = CheckpointManager(str(tmp_path / "a")).checkpoints()[-1].url
    before = _stored(tmp_path / "b")

    errors, trainers = _errors_of_fit(2, config.replace(checkpoint_dir=str(tmp_path / "b"), resume=elsewhere))

    assert sorted(errors) == [0, 1]
    assert f"{tmp_path / 'b'} holds the checkpoints of another run" in str(errors[0])
    assert f"not of the one resumed from {elsewhere}" in str(errors[0]) and "resume=auto" in str(errors[0])
    assert [len(t.steps) for t in trainers] == [0, 0] and _stored(tmp_path / "b") == before


def test_resume_from_starts_a_new_directory_and_a_restart_goes_on_from_its_own_newer_checkpoints(
        tmp_path: Path) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    first_job, second_job = str(tmp_path / "job-1"), str(tmp_path / "job-2")
    fit(2, problem, exact_config(2, first_job).replace(max_steps=4), momentum=EXACT_MOMENTUM)
    first_stored = _stored(Path(first_job))
    # another job, on 3 ranks: job-1's checkpoints where its own directory has none yet
    going_on = exact_config(3, second_job).replace(resume="auto", resume_from=f"{first_job}/latest")
    resumed = fit(3, problem, going_on.replace(max_steps=6), momentum=EXACT_MOMENTUM)  # preempted at 6

    restarted = fit(3, problem, going_on, momentum=EXACT_MOMENTUM)  # the scheduler runs it again, as it was

    assert resumed[0].steps[0].step == 4 and restarted[0].steps[0].step == 6  # its own, not job-1's again
    np.testing.assert_allclose(restarted[0].weights, uninterrupted()[0], rtol=0, atol=1e-12)
    assert set(_run_ids(second_job)) == set(_run_ids(first_job))  # one run, continued
    assert _stored(Path(first_job)) == first_stored  # job-1's checkpoints untouched


def _forget_run_ids(directory: Path) -> None:
    """Make the checkpoints look as an hvdazure from before run ids wrote them."""
    for manifest in directory.glob("step-*/manifest.json"):
        data = json.loads(manifest.read_text())
        del data["run_id"]
        manifest.write_text(json.dumps(data))


def test_checkpoints_from_before_run_ids_resume_and_become_the_resumed_run_s(tmp_path: Path) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    config = exact_config(2, str(tmp_path)).replace(keep_last=2)
    fit(2, problem, config.replace(max_steps=4), momentum=EXACT_MOMENTUM)
    _forget_run_ids(tmp_path)
    errors, _ = _errors_of_fit(1, config.replace(epochs=1))  # a fresh run is refused there, as before any
    assert "(written before run ids, newest step-00000004)" in str(errors[0])

    second = fit(2, problem, config.replace(resume="auto"), momentum=EXACT_MOMENTUM)

    np.testing.assert_allclose(second[0].weights, uninterrupted()[0], rtol=0, atol=1e-12)
    ids = _run_ids(tmp_path)
    assert len(ids) == 2 and None not in ids and len(set(ids)) == 1  # the old ones pruned with its own


@pytest.fixture
def azure_ml_job(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """`start(job)`: this process as a (new) process of Azure ML job `job`, as after a restart."""
    import hvdazure.core.checkpoint.trainer_checkpoints as trainer_checkpoints

    def start(job: str) -> None:
        monkeypatch.setenv("AZUREML_RUN_ID", job)
        monkeypatch.setattr(trainer_checkpoints, "_RUNS_STARTED", itertools.count(1))

    return start


def test_an_azure_ml_job_run_again_continues_its_own_checkpoints_without_resume(
        tmp_path: Path, azure_ml_job: Callable[[str], None]) -> None:
    problem = LinearProblem.make(RESUME_SAMPLES)
    config = exact_config(2, str(tmp_path)).replace(preemption_watch=False)
    azure_ml_job("job-1")
    fit(2, problem, config.replace(max_steps=4), momentum=EXACT_MOMENTUM)  # preempted after step 4

    azure_ml_job("job-1")  # Azure ML runs the same job again, with the same command (no resume)
    second = fit(2, problem, config, momentum=EXACT_MOMENTUM)

    assert second[0].steps[0].step == 4  # went on from the checkpoint
    np.testing.assert_allclose(second[0].weights, uninterrupted()[0], rtol=0, atol=1e-12)
    assert len(set(_run_ids(tmp_path))) == 1


@pytest.mark.parametrize("how", ["another job", "a second training of the same job"])
def test_a_fresh_run_of_another_azure_ml_job_or_training_is_refused(
        tmp_path: Path, azure_ml_job: Callable[[str], None], how: str) -> None:
    config = make_config(epochs=1, batch_size=3, checkpoint_dir=str(tmp_path), preemption_watch=False)
    azure_ml_job("job-1")
    fit(2, LinearProblem.make(RESUME_SAMPLES), config)
    if how == "another job":
        azure_ml_job("job-2")

    errors, _ = _errors_of_fit(2, config.replace(epochs=2))

    assert sorted(errors) == [0, 1] and "holds the checkpoints of another run (run job-1.1" in str(errors[0])
