"""hvdazure.core.callbacks.EarlyStopping: stop when a monitored metric stops improving."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from hvdazure.core.callbacks import EarlyStopping
from hvdazure.core.state import TrainState


@dataclass
class _Trainer:
    """All EarlyStopping reads and writes: the trainer's state."""

    state: TrainState = field(default_factory=TrainState)


def _evaluate(stopper: EarlyStopping, trainer: _Trainer, *values: float, name: str = "loss") -> None:
    """Run one evaluation per value, each reporting `eval_<name>` = value."""
    for value in values:
        trainer.state.eval_metrics = {name: value}
        stopper.on_eval_end(trainer)  # type: ignore[arg-type]


def _stops(stopper: EarlyStopping, *values: float, name: str = "loss") -> bool:
    trainer = _Trainer()
    _evaluate(stopper, trainer, *values, name=name)
    return trainer.state.stop_requested


def test_min_mode_keeps_going_while_the_metric_falls() -> None:
    assert not _stops(EarlyStopping("eval_loss", "min", patience=1), 1.0, 0.9, 0.5, 0.1)


def test_min_mode_stops_after_patience_evaluations_without_a_fall() -> None:
    stopper = EarlyStopping("eval_loss", "min", patience=2)
    trainer = _Trainer()
    _evaluate(stopper, trainer, 1.0, 1.2)
    assert not trainer.state.stop_requested
    _evaluate(stopper, trainer, 1.1)
    assert trainer.state.stop_requested


def test_max_mode_keeps_going_while_the_metric_rises() -> None:
    assert not _stops(EarlyStopping("eval_acc", "max", patience=1), 0.1, 0.5, 0.9, name="acc")


def test_max_mode_stops_after_patience_evaluations_without_a_rise() -> None:
    assert _stops(EarlyStopping("eval_acc", "max", patience=2), 0.9, 0.8, 0.85, name="acc")


def test_an_equal_value_is_not_an_improvement() -> None:
    assert _stops(EarlyStopping("eval_loss", "min", patience=1), 1.0, 1.0)


def test_an_improvement_resets_the_patience() -> None:
    stopper = EarlyStopping("eval_loss", "min", patience=2)
    assert not _stops(stopper, 1.0, 1.1, 0.9, 1.0)
    assert stopper.bad_evaluations == 1
    assert stopper.best == 0.9


def test_a_change_smaller_than_min_delta_is_not_an_improvement_in_min_mode() -> None:
    stopper = EarlyStopping("eval_loss", "min", patience=5, min_delta=0.1)
    _evaluate(stopper, _Trainer(), 1.0, 0.95)
    assert (stopper.best, stopper.bad_evaluations) == (1.0, 1)


def test_a_change_larger_than_min_delta_is_an_improvement_in_min_mode() -> None:
    stopper = EarlyStopping("eval_loss", "min", patience=5, min_delta=0.1)
    _evaluate(stopper, _Trainer(), 1.0, 0.85)
    assert (stopper.best, stopper.bad_evaluations) == (0.85, 0)


def test_min_delta_applies_in_max_mode() -> None:
    stopper = EarlyStopping("eval_acc", "max", patience=5, min_delta=0.1)
    _evaluate(stopper, _Trainer(), 0.5, 0.55, 0.65, name="acc")
    assert (stopper.best, stopper.bad_evaluations) == (0.65, 0)
    _evaluate(stopper, _Trainer(), 0.7, name="acc")
    assert (stopper.best, stopper.bad_evaluations) == (0.65, 1)


@pytest.mark.parametrize("mode", ["min", "max"])
def test_nan_never_improves(mode: str) -> None:
    stopper = EarlyStopping("eval_loss", mode, patience=2)
    assert _stops(stopper, 1.0, math.nan, math.nan)
    assert stopper.best == 1.0


def test_a_nan_first_evaluation_does_not_block_later_improvements() -> None:
    stopper = EarlyStopping("eval_loss", "min", patience=2)
    assert not _stops(stopper, math.nan, 1.0, 0.9)
    assert stopper.best == 0.9


def test_train_metrics_can_be_monitored_with_the_train_prefix() -> None:
    stopper = EarlyStopping("train_loss", "min", patience=1)
    trainer = _Trainer()
    for loss in (1.0, 2.0):
        trainer.state.train_metrics = {"loss": loss}
        stopper.on_eval_end(trainer)  # type: ignore[arg-type]
    assert trainer.state.stop_requested


def test_an_unknown_monitor_raises_key_error_listing_the_metrics() -> None:
    trainer = _Trainer()
    trainer.state.eval_metrics = {"loss": 1.0, "acc": 0.5}
    trainer.state.train_metrics = {"loss": 1.2}
    with pytest.raises(KeyError) as exc_info:
        EarlyStopping("eval_accuracy").on_eval_end(trainer)  # type: ignore[arg-type]
    assert exc_info.value.args[0] == ("early stopping monitors 'eval_accuracy', but the metrics are "
                                      "eval_acc, eval_loss, train_loss")


def test_the_stop_reason_names_the_metric_the_patience_and_the_best_value() -> None:
    trainer = _Trainer()
    _evaluate(EarlyStopping("eval_loss", "min", patience=2), trainer, 0.25, 0.3, 0.4)
    expected = "early stopping: eval_loss did not improve for 2 evaluations (best 0.25)"
    assert trainer.state.stop_reason == expected


def test_the_stop_reason_says_a_better_value_fell_short_of_min_delta() -> None:
    """0.944444 > 0.938889 reads as an improvement unless the reason says it was below min_delta."""
    trainer = _Trainer()
    _evaluate(EarlyStopping("eval_acc", "max", patience=1, min_delta=0.01), trainer, 0.938889, 0.944444,
              name="acc")
    assert trainer.state.stop_reason == ("early stopping: eval_acc did not improve for 1 evaluation "
                                         "(0.944444 is better than the best 0.938889 by less than min_delta "
                                         "0.01)")


def test_the_stop_reason_when_every_value_was_nan() -> None:
    trainer = _Trainer()
    _evaluate(EarlyStopping("eval_loss", "min", patience=2), trainer, math.nan, math.nan)
    assert trainer.state.stop_reason == ("early stopping: eval_loss did not improve for 2 evaluations "
                                         "(every value was nan)")


def test_an_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="'minimum'"):
        EarlyStopping("eval_loss", "minimum")


def test_state_dict_holds_the_best_value_and_the_bad_evaluations() -> None:
    stopper = EarlyStopping("eval_loss", "min", patience=3)
    _evaluate(stopper, _Trainer(), 0.5, 0.6)
    assert stopper.state_dict() == {"best": 0.5, "bad_evaluations": 1}


def test_a_restored_early_stopping_continues_counting_where_it_left_off() -> None:
    before = EarlyStopping("eval_loss", "min", patience=2)
    _evaluate(before, _Trainer(), 0.5, 0.6)
    after = EarlyStopping("eval_loss", "min", patience=2)
    after.load_state_dict(before.state_dict())
    assert _stops(after, 0.55)
