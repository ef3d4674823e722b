"""predict() and test() with the model as build_model() returns it (no fit(), no checkpoint=), a file that is
not an hvdazure checkpoint named as one, and save_checkpoint() before fit(): in the real loop on simulated
ranks (tests/fakes/fake_backend.py), and the export command's refusal of such a file. The real bindings on
real ranks, with a build_model that loads a pretrained file: tests/distributed/test_predict.py."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from fakes.fake_backend import FakeTrainer, LinearProblem, ThreadWorld, initial_weights

from hvdazure import TrainConfig
from hvdazure.core.checkpoint.integrity import CheckpointError
from hvdazure.core.checkpoint.weights import NotACheckpoint, exported_file, recorded_config
from hvdazure.core.config import ConfigError
from hvdazure.core.script.export import ExportRequest, export_checkpoint
from hvdazure.core.trainer_classes import trainer_class_in

PROBLEM = LinearProblem.make(num_samples=37, num_eval=23, dim=3, seed=4)
UNSEEN = LinearProblem.make(num_samples=101, dim=3, seed=5)
# What each kind of file is called in the one line, and how it says to load it
NOT = "not an hvdazure checkpoint (a directory with a manifest.json)"
FILES = {
    "model.pt": f"is a PyTorch file, {NOT}: load it in build_model: "
                "model.load_state_dict(torch.load(path, weights_only=True))",
    "model.keras": f"is a Keras model file, {NOT}: load it in build_model: "
                   "return keras.models.load_model(path)",
    "model.safetensors": f"is a safetensors file, {NOT}: load it in build_model: "
                         "model.load_state_dict(safetensors.torch.load_file(path))",
    "weights.txt": f"is a file, {NOT}: a model file from elsewhere is loaded in build_model (torch.load, "
                   "keras.models.load_model)",
}


def _config(tmp_path: Path, **fields: object) -> TrainConfig:
    return TrainConfig(**{"epochs": 1, "batch_size": 4, "lr": 0.05, "progress_bar": False,  # type: ignore[arg-type]
                          "checkpoint_dir": str(tmp_path / "ckpt"), **fields})


def _run(world_size: int, config: TrainConfig, work):  # type: ignore[no-untyped-def]
    world = ThreadWorld(world_size)
    trainers = [FakeTrainer(world, rank, PROBLEM, config) for rank in range(world_size)]
    return world.run([lambda t=t: work(t) for t in trainers]), trainers


def _outcome(call):  # type: ignore[no-untyped-def]
    try:
        return call()
    except (ConfigError, CheckpointError) as exc:
        return f"{type(exc).__name__}: {exc}"


def test_without_a_checkpoint_every_rank_predicts_with_rank_0s_model_as_built(tmp_path: Path) -> None:
    """The ranks of the test double build different weights (seeded by rank): every rank predicts with
    rank 0's, as a build_model that loads pretrained weights on rank 0 only would need."""
    def work(trainer: FakeTrainer):  # type: ignore[no-untyped-def]
        return trainer.predict((UNSEEN.x, UNSEEN.y)), trainer.test(), trainer.predict((UNSEEN.x, UNSEEN.y))

    outcomes, trainers = _run(3, _config(tmp_path), work)
    rank0 = UNSEEN.x @ initial_weights(3, 0, 0)
    assert not np.allclose(rank0, UNSEEN.x @ initial_weights(3, 0, 1))  # the ranks did build differently
    for predictions, metrics, again in outcomes:
        assert predictions["index"].tolist() == list(range(101))
        assert predictions["y"].tobytes() == rank0.tobytes() == again["y"].tobytes()
        assert metrics == outcomes[0][1]
    assert all(not t.backend.steps for t in trainers)  # nothing trained


def test_a_checkpoint_loaded_before_stays_until_another_is_named(tmp_path: Path) -> None:
    config = _config(tmp_path)
    _run(2, config, lambda t: t.fit())

    def work(trainer: FakeTrainer):  # type: ignore[no-untyped-def]
        unseen = (UNSEEN.x, UNSEEN.y)
        return trainer.predict(unseen, checkpoint="latest")["y"], trainer.predict(unseen)["y"]

    outcomes, _ = _run(2, config, work)
    for loaded, then in outcomes:
        assert then.tobytes() == loaded.tobytes()
        assert then.tobytes() != (UNSEEN.x @ initial_weights(3, 0, 0)).tobytes()


@pytest.mark.parametrize("name", sorted(FILES))
def test_a_file_named_as_the_checkpoint_is_one_line_on_every_rank(tmp_path: Path, name: str) -> None:
    model_file = tmp_path / name
    model_file.write_bytes(b"weights from elsewhere")
    unseen = (UNSEEN.x, UNSEEN.y)
    outcomes, _ = _run(3, _config(tmp_path),
                       lambda t: _outcome(lambda: t.predict(unseen, checkpoint=str(model_file))))
    assert outcomes == [f"NotACheckpoint: {model_file} {FILES[name]}; then predict() without checkpoint= "
                        "uses that model"] * 3
    assert NotACheckpoint.exit_status == 2  # bad input, not a damaged checkpoint


def test_a_file_is_one_line_for_load_weights_and_test_too(tmp_path: Path) -> None:
    model_file = tmp_path / "model.pt"
    model_file.write_bytes(b"weights from elsewhere")
    line = re.escape(f"{model_file} {FILES['model.pt']}")
    with pytest.raises(NotACheckpoint, match=f"^{line}$"), \
            exported_file(str(model_file), "latest", "model.pt"):
        pass
    with pytest.raises(NotACheckpoint):
        recorded_config(str(model_file))
    outcomes, _ = _run(2, _config(tmp_path), lambda t: _outcome(lambda: t.test(checkpoint=str(model_file))))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0].endswith("; then test() without checkpoint= uses that model")


def test_the_export_of_a_file_says_what_it_is_and_writes_nothing(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nfrom hvdazure.torch import TorchTrainer\n\n\n"
                      "class Regression(TorchTrainer):\n"
                      "    def build_model(self):\n        return torch.nn.Linear(3, 1)\n")
    model_file = tmp_path / "model.safetensors"
    model_file.write_bytes(b"weights from elsewhere")
    output = tmp_path / "model.onnx"
    with pytest.raises(NotACheckpoint, match=r"model\.safetensors is a safetensors file, not an hvdazure "
                                             r"checkpoint .*: load it in build_model: .*\)$"):
        export_checkpoint(trainer_class_in(str(script)),
                          ExportRequest(str(model_file), "latest", str(output)))
    assert not output.exists()


def test_save_checkpoint_before_fit_says_it_saves_a_step_of_training(tmp_path: Path) -> None:
    outcomes, _ = _run(2, _config(tmp_path), lambda t: _outcome(lambda: t.save_checkpoint()))
    assert outcomes == ["CheckpointError: save_checkpoint() before fit(): a checkpoint is a step of training "
                        "(model, optimizer, data position); call it from a callback or hook during fit(), "
                        "or after fit()"] * 2
    assert not (tmp_path / "ckpt").exists()


def test_save_checkpoint_after_a_fit_without_checkpoint_dir_says_checkpointing_is_off(tmp_path: Path) -> None:
    def work(trainer: FakeTrainer) -> str:
        trainer.fit()
        return _outcome(lambda: trainer.save_checkpoint())

    outcomes, _ = _run(1, _config(tmp_path, checkpoint_dir=None), work)
    assert outcomes == ["CheckpointError: checkpointing is off: set checkpoint_dir"]


@pytest.mark.parametrize("checkpoint_dir", [True, False], ids=["with-checkpoint-dir", "without"])
def test_a_model_file_named_as_resume_is_one_line_saying_how_to_load_it(tmp_path: Path,
                                                                        checkpoint_dir: bool) -> None:
    """resume= names a model file from elsewhere: every rank says what it is and how to load it, instead of
    a NotADirectoryError on its manifest, and nothing is trained."""
    model_file = tmp_path / "model.pt"
    model_file.write_bytes(b"not a checkpoint")
    fields: dict[str, object] = {"resume": str(model_file)}
    if not checkpoint_dir:
        fields["checkpoint_dir"] = None
    outcomes, trainers = _run(2, _config(tmp_path, **fields), lambda t: _outcome(t.fit))
    for outcome in outcomes:
        assert isinstance(outcome, str) and FILES["model.pt"] in outcome, outcome
        assert "resume= goes on from an hvdazure checkpoint" in outcome and "NotADirectory" not in outcome
    assert [t.state.step for t in trainers] == [0, 0]
