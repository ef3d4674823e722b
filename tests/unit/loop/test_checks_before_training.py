"""What the loop checks before its first step, on ranks simulated by threads (tests/fakes/fake_backend.py): a
global batch larger than the training set, an empty training or evaluation set, and the sanity check that
runs validation_step on one batch per rank (TrainConfig.sanity_check) without changing what training does.

Each refusal must come on every rank by itself, before any collective of training: a rank that went on
would wait for the others in its first step, which the thread world reports as a mismatch.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakes.fake_backend import FakeTrainer, LinearProblem, ThreadWorld

from hvdazure.core.backend import DataError
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.metrics import HookReturnError


def config(**fields: Any) -> TrainConfig:
    return TrainConfig(**{"lr": 0.05, "progress_bar": False, "batch_size": 2, **fields})


def fit(world_size: int, problem: LinearProblem, cfg: TrainConfig,
        trainer_class: type[FakeTrainer] = FakeTrainer) -> list[FakeTrainer]:
    world = ThreadWorld(world_size)
    trainers = [trainer_class(world, rank, problem, cfg) for rank in range(world_size)]
    world.run([trainer.fit for trainer in trainers])
    return trainers


def errors_of(world_size: int, problem: LinearProblem, cfg: TrainConfig,
              trainer_class: type[FakeTrainer] = FakeTrainer) -> tuple[list[Exception], list[FakeTrainer]]:
    """Every rank's error (each rank must raise one), and the trainers."""
    world = ThreadWorld(world_size)
    trainers = [trainer_class(world, rank, problem, cfg) for rank in range(world_size)]
    errors: list[Exception | None] = [None] * world_size

    def run(rank: int) -> None:
        try:
            trainers[rank].fit()
        except Exception as exc:
            errors[rank] = exc
            return
        raise AssertionError(f"rank {rank} trained to the end")

    world.run([functools.partial(run, rank) for rank in range(world_size)])
    assert all(error is not None for error in errors)
    return errors, trainers  # type: ignore[return-value]


def assert_nothing_trained(trainers: list[FakeTrainer]) -> None:
    assert all(not t.steps and t.forward_passes == 0 for t in trainers)


# --- the global batch and the training set ----------------------------------------------------------------
@pytest.mark.parametrize(("world_size", "accum", "batch_size", "num_samples", "message"), [
    (1, 1, 5000, 1437, "the global batch of 5000 samples (5000 x 1 rank(s) x 1 grad_accum_steps) is larger "
                       "than the 1437 training samples: every epoch would be one step of 1437 samples, with "
                       "the LR scaled for 5000; use a batch_size of at most 1437"),
    (2, 1, 5000, 1437, "the global batch of 10000 samples (5000 x 2 rank(s) x 1 grad_accum_steps) is larger "
                       "than the 1437 training samples: every epoch would be one step of 1437 samples, with "
                       "the LR scaled for 10000; use a batch_size of at most 718"),
    (3, 2, 4, 23, "the global batch of 24 samples (4 x 3 rank(s) x 2 grad_accum_steps) is larger than the 23 "
                  "training samples: every epoch would be one step of 23 samples, with the LR scaled for 24; "
                  "use a batch_size of at most 3"),
    (4, 2, 1, 7, "the global batch of 8 samples (1 x 4 rank(s) x 2 grad_accum_steps) is larger than the 7 "
                 "training samples: every epoch would be one step of 7 samples, with the LR scaled for 8; "
                 "use fewer ranks or grad_accum_steps (ranks x grad_accum_steps at most 7)"),
])
def test_a_global_batch_larger_than_the_training_set_is_refused_on_every_rank_before_training(
        world_size: int, accum: int, batch_size: int, num_samples: int, message: str) -> None:
    cfg = config(batch_size=batch_size, grad_accum_steps=accum)

    errors, trainers = errors_of(world_size, LinearProblem.make(num_samples), cfg)

    assert [str(e) for e in errors] == [f"config field 'batch_size': {message}"] * world_size
    assert all(type(e) is ConfigError for e in errors)
    assert_nothing_trained(trainers)


def test_without_lr_scaling_the_refusal_does_not_speak_of_a_scaled_lr() -> None:
    errors, _ = errors_of(1, LinearProblem.make(10), config(batch_size=11, lr_scaling="none"))

    assert "every epoch would be one step of 10 samples; use a batch_size of at most 10" in str(errors[0])


def test_a_global_batch_of_the_whole_training_set_trains_one_full_step_per_epoch() -> None:
    trainers = fit(2, LinearProblem.make(12), config(epochs=2, batch_size=3, grad_accum_steps=2))

    assert [sum(map(len, s.micro_batches)) for s in trainers[0].steps] == [6, 6]
    assert all(len(indices) == 3 for t in trainers for s in t.steps for indices in s.micro_batches)


def test_a_resume_on_more_ranks_whose_global_batch_outgrows_the_training_set_is_refused(
        tmp_path: Path) -> None:
    problem, cfg = LinearProblem.make(12), config(epochs=2, batch_size=8, checkpoint_dir=str(tmp_path))
    fit(1, problem, cfg.replace(max_steps=2))

    errors, trainers = errors_of(2, problem, cfg.replace(resume="auto"))

    assert all("global batch of 16 samples (8 x 2 rank(s)" in str(e) and "use a batch_size of at most 6"
               in str(e) for e in errors)
    assert_nothing_trained(trainers)


def test_an_empty_training_set_is_one_line_on_every_rank() -> None:
    errors, _ = errors_of(2, LinearProblem.make(0), config())

    assert [str(e) for e in errors] == ["train_dataset() holds no samples: there is nothing to train on"] * 2
    assert all(isinstance(e, DataError) for e in errors)


# --- the evaluation set -------------------------------------------------------------------------------------
def with_eval_set(problem: LinearProblem, num_eval: int) -> LinearProblem:
    eval_problem = LinearProblem.make(num_eval, dim=problem.dim, seed=5)
    return LinearProblem(problem.x, problem.y, eval_problem.x, eval_problem.y)


@pytest.mark.parametrize(("world_size", "batch_size", "num_eval"), [(4, 2, 1), (3, 50, 7), (2, 5000, 3)],
                         ids=["fewer samples than ranks", "a batch larger than the set", "a huge batch"])
def test_an_evaluation_set_smaller_than_the_world_or_a_batch_is_evaluated_exactly(
        world_size: int, batch_size: int, num_eval: int) -> None:
    problem = with_eval_set(LinearProblem.make(batch_size * world_size), num_eval)

    trainers = fit(world_size, problem, config(batch_size=batch_size))

    expected = np.mean(problem.sample_losses(trainers[0].weights, range(num_eval), eval_set=True))
    for trainer in trainers:
        assert trainer.state.history[-1]["eval_loss"] == pytest.approx(expected, rel=1e-12)


def test_an_empty_evaluation_set_is_refused_on_every_rank_before_training() -> None:
    problem = with_eval_set(LinearProblem.make(8), 0)

    errors, trainers = errors_of(2, problem, config())

    assert [str(e) for e in errors] == ["eval_dataset() holds no samples: return None for no evaluation"] * 2
    assert all(isinstance(e, DataError) for e in errors)
    assert_nothing_trained(trainers)


def test_without_the_sanity_check_an_empty_evaluation_set_is_refused_at_the_first_evaluation() -> None:
    problem = with_eval_set(LinearProblem.make(8), 0)

    errors, trainers = errors_of(2, problem, config(sanity_check=False))

    assert [str(e) for e in errors] == ["eval_dataset() holds no samples: return None for no evaluation"] * 2
    assert all(t.state.epoch == 0 and len(t.steps) == 2 for t in trainers)  # the first epoch trained


# --- the sanity check of validation_step --------------------------------------------------------------------
class RecordsValidation(FakeTrainer):
    """Records, at every validation batch, how many optimizer steps had been taken and the batch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.validated: list[tuple[int, list[int]]] = []

    def validation_metrics(self, indices: range) -> dict[str, Any]:
        self.validated.append((len(self.steps), list(indices)))
        return {}


def test_the_sanity_check_runs_one_validation_batch_per_rank_before_the_first_step() -> None:
    # 2 evaluation samples on 3 ranks: rank 2 has none of its own and checks on the set's first batch
    problem = with_eval_set(LinearProblem.make(12), 2)

    trainers = fit(3, problem, config(epochs=2, batch_size=4), RecordsValidation)

    assert [t.sanity_checks for t in trainers] == [1, 1, 1]
    assert [t.validated[0] for t in trainers] == [(0, [0]), (0, [1]), (0, [0, 1])]
    # then the evaluations after each epoch, of each rank's own share, and nothing more in the history
    assert [t.validated[1:] for t in trainers] == [[(1, [0]), (2, [0])], [(1, [1]), (2, [1])], []]
    assert [r["epoch"] for r in trainers[0].state.history] == [0, 1]


def test_sanity_check_false_skips_it() -> None:
    trainers = fit(2, with_eval_set(LinearProblem.make(8), 5), config(sanity_check=False), RecordsValidation)

    assert [t.sanity_checks for t in trainers] == [0, 0]
    assert all(step == 2 for t in trainers for step, _ in t.validated)


def test_without_evaluation_data_there_is_nothing_to_check() -> None:
    trainers = fit(2, LinearProblem.make(8), config(), RecordsValidation)

    assert [t.validated for t in trainers] == [[], []]


class ProbabilitiesMetric(FakeTrainer):
    """validation_step returns a value per sample and class (softmax probabilities, say) as a metric."""

    def validation_metrics(self, indices: range) -> dict[str, Any]:
        return {"probs": np.full((len(indices), 3), 1 / 3)}


def test_a_validation_metric_that_is_not_one_number_is_refused_on_every_rank_before_training() -> None:
    errors, trainers = errors_of(2, with_eval_set(LinearProblem.make(8), 6), config(batch_size=2),
                                 ProbabilitiesMetric)

    assert all(isinstance(e, HookReturnError) for e in errors)
    assert [str(e) for e in errors] == ["validation_step returned metric 'probs' of shape (2, 3): it must be "
                                        "the mean over the batch (one number)"] * 2
    assert_nothing_trained(trainers)


class BrokenValidation(FakeTrainer):
    def validation_metrics(self, indices: range) -> dict[str, Any]:
        return {"accuracy": self.config.extra["no such setting"]}


def test_an_error_in_validation_step_is_raised_before_training_naming_the_check() -> None:
    errors, trainers = errors_of(2, with_eval_set(LinearProblem.make(8), 6), config(), BrokenValidation)

    assert all(type(e) is KeyError for e in errors)  # the user's own error, with its traceback
    assert all("validation_metrics" in [frame.name for frame in _frames(e)] for e in errors)
    for error in errors:
        assert error.__notes__ == ["hvdazure: raised while checking validation_step on one evaluation batch "
                                   "before training (config field sanity_check: false skips this check)"]
    assert_nothing_trained(trainers)


def _frames(error: BaseException) -> list[Any]:
    import traceback
    return traceback.extract_tb(error.__traceback__)


class NoisyValidation(FakeTrainer):
    """validation_step draws from this rank's framework RNG, as an augmentation or a dropout left on would:
    the check must give it back as it found it. (Python's and NumPy's global streams, which the core
    restores too, are shared by the threads that are ranks here: their draws would mix the ranks'.)"""

    def validation_metrics(self, indices: range) -> dict[str, Any]:
        return {"noise": float(self.backend.rng.random())}


def test_the_sanity_check_changes_nothing_training_draws_or_reports() -> None:
    problem = with_eval_set(LinearProblem.make(23), 5)
    cfg = config(epochs=3, batch_size=2)

    checked = fit(3, problem, cfg, NoisyValidation)
    unchecked = fit(3, problem, cfg.replace(sanity_check=False), NoisyValidation)

    for a, b in zip(checked, unchecked, strict=True):
        assert [s.random_draw for s in a.steps] == [s.random_draw for s in b.steps]
        np.testing.assert_array_equal(a.weights, b.weights)
        assert a.state.history == b.state.history


def test_a_resumed_run_is_checked_again_and_ends_as_the_uninterrupted_run(tmp_path: Path) -> None:
    problem = with_eval_set(LinearProblem.make(23), 5)
    cfg = config(epochs=3, batch_size=2, checkpoint_dir=str(tmp_path / "ckpt"))

    whole = fit(2, problem, cfg.replace(checkpoint_dir=None), NoisyValidation)
    first = fit(2, problem, cfg.replace(max_steps=6), NoisyValidation)  # at the end of epoch 1
    second = fit(2, problem, cfg.replace(resume="auto"), NoisyValidation)

    assert [t.sanity_checks for t in second] == [1, 1]
    for rank in range(2):
        draws = [s.random_draw for s in first[rank].steps + second[rank].steps]
        assert draws == [s.random_draw for s in whole[rank].steps]
        np.testing.assert_array_equal(second[rank].weights, whole[rank].weights)
    assert second[0].state.history == whole[0].state.history
