"""trainer.log_metrics in the real loop on simulated ranks (tests/fakes/fake_backend.py, a test double of a
framework backend): reduced with the step's metrics, weighted by each rank's samples, in the history."""

import pytest
from fakes.fake_backend import FakeTrainer, LinearProblem, ThreadWorld

from hvdazure import Callback, TrainConfig
from hvdazure.core.config import ConfigError

PROBLEM = LinearProblem.make(num_samples=37, dim=3, seed=4)  # batch 4 on 3 ranks: a short, uneven last step


class LogsEveryStep(Callback):
    def on_step_end(self, trainer):
        trainer.log_metrics({"seven": 7.0, "rank": float(trainer.rank)})


class LogsInTrainingStep(FakeTrainer):
    """training_metrics is the fake's training_step hook: log_metrics there is weighted by the micro-batch."""

    def training_metrics(self, indices):
        self.log_metrics({"first_index": float(indices[0])})
        return {}


def _fit(world_size, trainer_class=FakeTrainer, callbacks=(), **fields):
    config = TrainConfig(**{"epochs": 2, "batch_size": 4, "lr": 0.05, "progress_bar": False, **fields})
    world = ThreadWorld(world_size)
    trainers = [trainer_class(world, rank, PROBLEM, config, callbacks) for rank in range(world_size)]
    return world.run([t.fit for t in trainers]), trainers


def test_logged_metrics_are_sample_weighted_means_over_ranks_in_the_history_of_every_rank():
    histories, trainers = _fit(3, callbacks=[LogsEveryStep()], log_every=2)
    for epoch in range(2):
        samples = {rank: sum(len(mb) for step in t.steps if step.epoch == epoch for mb in step.micro_batches)
                   for rank, t in enumerate(trainers)}
        expected = sum(rank * n for rank, n in samples.items()) / sum(samples.values())
        for history in histories:
            assert history[epoch]["train_seven"] == 7.0
            assert history[epoch]["train_rank"] == pytest.approx(expected, rel=1e-15)
    assert histories[0] == histories[1] == histories[2]


def test_from_the_training_step_a_value_is_weighted_by_its_micro_batch():
    histories, trainers = _fit(2, trainer_class=LogsInTrainingStep, grad_accum_steps=2)
    micro = [(mb[0], len(mb)) for t in trainers for step in t.steps if step.epoch == 0
             for mb in step.micro_batches if mb]
    expected = sum(first * n for first, n in micro) / sum(n for _, n in micro)
    assert histories[0][0]["train_first_index"] == pytest.approx(expected, rel=1e-15)


class LogsAtEpochEnd(Callback):
    def on_epoch_end(self, trainer):
        trainer.log_metrics({"x": 1.0})


class LogsTheLoss(Callback):
    def on_step_end(self, trainer):
        trainer.log_metrics({"loss": 1.0})


class LogsText(Callback):
    def on_step_end(self, trainer):
        trainer.log_metrics({"note": "fine"})


@pytest.mark.parametrize(("callback", "message"), [
    (LogsAtEpochEnd(), "log_metrics is for a training step: call it from training_step or a callback's "
                       "on_step_begin / on_step_end"),
    (LogsTheLoss(), "log_metrics: 'loss' is training_step's own metric; log it under another name"),
    (LogsText(), "log_metrics: 'note' is a str: log one number"),
])
def test_what_log_metrics_refuses_is_one_line(callback, message):
    with pytest.raises(ConfigError) as raised:
        _fit(1, callbacks=[callback])
    assert str(raised.value).startswith(message)
