"""predict() and test() in the real loop on simulated ranks (tests/fakes/fake_backend.py: a test double of
a framework backend, ranks as threads), at many world sizes in milliseconds; the real bindings on real
ranks: tests/distributed/test_predict.py."""

import numpy as np
import pytest
from fakes.fake_backend import FakeTrainer, LinearProblem, ThreadWorld

from hvdazure import TrainConfig
from hvdazure.core.backend import DataError
from hvdazure.core.checkpoint.integrity import CheckpointError
from hvdazure.core.config import ConfigError
from hvdazure.data.index import INDEX_NAME

PROBLEM = LinearProblem.make(num_samples=37, num_eval=23, dim=3, seed=4)
UNSEEN = LinearProblem.make(num_samples=101, dim=3, seed=5)  # 101 samples: batches of 4, the last of 1


def _config(tmp_path, **fields):
    return TrainConfig(**{"epochs": 1, "batch_size": 4, "lr": 0.05, "progress_bar": False,
                          "checkpoint_dir": str(tmp_path / "ckpt"), **fields})


def _run(world_size, config, work):
    """`work(trainer)` on every rank of a new world; the ranks' results and trainers."""
    world = ThreadWorld(world_size)
    trainers = [FakeTrainer(world, rank, PROBLEM, config) for rank in range(world_size)]
    return world.run([lambda t=t: work(t) for t in trainers]), trainers


def _outcome(call):
    try:
        return call()
    except (ConfigError, CheckpointError, DataError) as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One training on 2 ranks, then its predictions and test metrics, as every rank returned them."""
    config = _config(tmp_path_factory.mktemp("trained"))

    def work(trainer):
        history = trainer.fit()
        return trainer.predict((UNSEEN.x, UNSEEN.y)), trainer.test(), history

    results, _ = _run(2, config, work)
    return config, results


def test_predictions_after_fit_are_every_sample_once_in_order_on_every_rank(trained):
    _, results = trained
    for predictions, _, _ in results:
        assert predictions["index"].tolist() == list(range(101))
        assert predictions["y"].tobytes() == results[0][0]["y"].tobytes()


def test_test_gives_the_evaluation_of_fit(trained):
    _, results = trained
    for _, metrics, history in results:
        assert metrics == {"loss": history[-1]["eval_loss"]}


@pytest.mark.parametrize("world_size", [1, 3, 5, 7, 30])
def test_from_the_checkpoint_every_world_size_predicts_the_same_batches_and_bytes(trained, world_size):
    config, results = trained

    def work(trainer):
        return trainer.predict((UNSEEN.x, UNSEEN.y), checkpoint="latest"), trainer.test(checkpoint="latest")

    outcomes, trainers = _run(world_size, config, work)
    batches = [b for t in trainers for b in t.backend.predicted_batches]
    assert batches == [list(range(i, min(i + 4, 101))) for i in range(0, 101, 4)]  # the set's, in order
    counts = [len(t.backend.predicted_batches) for t in trainers]
    assert max(counts) - min(counts) <= 1
    for predictions, metrics in outcomes:
        assert predictions["index"].tolist() == list(range(101))
        assert predictions["y"].tobytes() == results[0][0]["y"].tobytes()
        assert metrics == pytest.approx(results[0][1], rel=1e-12)


def test_latest_without_a_checkpoint_dir_is_refused(tmp_path):
    outcomes, _ = _run(2, _config(tmp_path, checkpoint_dir=None),
                       lambda t: _outcome(lambda: t.test(checkpoint="latest")))
    assert outcomes == ["ConfigError: test(checkpoint='latest') needs checkpoint_dir in the config, or give "
                        "the checkpoint's path"] * 2


def test_a_checkpoint_that_does_not_load_is_refused_on_every_rank_not_only_where_it_was_read(tmp_path):
    missing = tmp_path / "nowhere"
    outcomes, _ = _run(3, _config(tmp_path), lambda t: _outcome(lambda: t.predict(checkpoint=str(missing))))
    assert outcomes == [f"CheckpointError: {missing}: no such directory"] * 3


def test_no_dataset_and_no_hook_is_refused(tmp_path):
    problem = LinearProblem.make(num_samples=37, dim=3, seed=4)  # no evaluation set
    world = ThreadWorld(1)
    trainer = FakeTrainer(world, 0, problem, _config(tmp_path, checkpoint_dir=None))
    outcome = world.run([lambda: (trainer.fit(), _outcome(lambda: trainer.predict()))])[0][1]
    assert outcome == "DataError: predict() needs a dataset: pass one, or implement predict_dataset()"



@pytest.mark.parametrize("world_size", [1, 3, 7])
def test_predictions_written_as_shards_are_a_dataset_in_dataset_order(trained, tmp_path, world_size):
    config, results = trained
    output = tmp_path / "predictions"

    def work(trainer):
        return trainer.predict((UNSEEN.x, UNSEEN.y), checkpoint="latest", output=str(output))

    datasets, _ = _run(world_size, config, work)
    samples = [datasets[0][i] for i in range(len(datasets[0]))]
    assert len(samples) == 101 and all(len(d) == 101 for d in datasets)
    assert [s["index"] for s in samples] == list(range(101))
    assert np.array([s["y"] for s in samples]).tobytes() == results[0][0]["y"].tobytes()
    shards = sorted(p.name for p in output.glob("*.tar"))
    assert {name.split("-")[1] for name in shards} == {f"{r:05d}" for r in range(min(world_size, 26))}


def test_predictions_are_not_written_over_a_dataset(trained, tmp_path):
    config, _ = trained
    output = tmp_path / "predictions"

    def work(trainer):
        unseen = (UNSEEN.x, UNSEEN.y)
        return _outcome(lambda: trainer.predict(unseen, checkpoint="latest", output=str(output)))

    _run(2, config, work)
    outcomes, _ = _run(2, config, work)
    assert outcomes[0] == outcomes[1]
    assert outcomes[0].startswith(f"DataError: predict(output='{output}'): {output} already holds shards")


def test_a_rank_that_cannot_write_its_part_fails_every_rank_and_no_index_is_written(trained, tmp_path):
    config, _ = trained
    output = tmp_path / "predictions"
    world = ThreadWorld(3)
    trainers = [FakeTrainer(world, rank, PROBLEM, config) for rank in range(3)]
    predict = trainers[1].backend.predict

    def rank1_fails_midway(data, batches):
        yield from predict(data, batches[:1])
        raise OSError("disk full")

    trainers[1].backend.predict = rank1_fails_midway  # rank 1 of the test double fails after one batch

    def work(trainer):
        try:
            trainer.predict((UNSEEN.x, UNSEEN.y), checkpoint="latest", output=str(output))
        except (OSError, DataError) as exc:
            return f"{type(exc).__name__}: {exc}"

    outcomes = world.run([lambda t=t: work(t) for t in trainers])
    assert outcomes[1] == "OSError: disk full"  # its own error, raised where it happened
    assert outcomes[0] == outcomes[2] == (
        f"DataError: predict(output='{output}'): rank 1 could not write its predictions (OSError: disk "
        "full); the directory has no index: predict into a new one")
    assert not (output / INDEX_NAME).exists() and list(output.glob("*.tar"))
