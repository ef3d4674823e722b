"""`hvdazure export` and a script's `export` mode, up to the point where the ranks would start: which
trainer class a script has (core/trainer_classes.py: imported, its main block not run), the config the
model is built with (the checkpoint's, under --config/--set), and every refusal, each one line and before
any work (core/script/export.py). The exports themselves, from real checkpoints of real training jobs:
tests/distributed/test_predict.py."""

from __future__ import annotations

import io
import json
import os
import textwrap
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from hvdazure.cli import main as cli_main
from hvdazure.core.checkpoint.store import CheckpointError, CheckpointManager
from hvdazure.core.config import ConfigError, TrainConfig
from hvdazure.core.script.export import ExportRequest, export_checkpoint, export_request, read_example
from hvdazure.core.script.model_export import ExportError
from hvdazure.core.trainer import Trainer
from hvdazure.core.trainer_classes import trainer_class_in

TRAINER = """
import torch
from hvdazure.torch import TorchTrainer

class {name}({base}):
    def build_model(self):
        return torch.nn.Linear(3, 1)
"""


def _script(folder: Path, body: str, name: str = "train.py") -> str:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def _checkpoint(folder: Path, config: TrainConfig | None = None, step: int = 1) -> str:
    """A checkpoint directory whose manifest records `config` (its model file is never read here)."""
    def model(file) -> None:
        file.write(b"weights")

    manifest = {"config": config.to_dict()} if config is not None else {}
    CheckpointManager(str(folder)).save(step, {"model.pt": model}, manifest)
    return str(folder)


class ConfigSeen(Exception):
    """What a trainer class built by the export was given: raised by its __init__, before any rank starts."""

    def __init__(self, config: TrainConfig) -> None:
        super().__init__("built")
        self.config = config


def _records_its_config(config: TrainConfig) -> None:
    raise ConfigSeen(config)


# --- the script's trainer class ----------------------------------------------------------------------
def test_the_script_is_imported_without_running_its_main_block(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = _script(tmp_path, TRAINER.format(name="Regression", base="TorchTrainer") + f"""
if __name__ == "__main__":
    open({str(marker)!r}, "w").write("the main block ran")
    Regression.main()
""")
    found = trainer_class_in(script)
    assert found.__name__ == "Regression"
    assert not marker.exists()


def test_a_script_that_exits_as_it_is_imported_is_one_line(tmp_path: Path) -> None:
    script = _script(tmp_path, TRAINER.format(name="Regression", base="TorchTrainer") + """
import argparse
argparse.ArgumentParser().add_argument("--data", required=True)
argparse.ArgumentParser(prog="train.py").parse_args(["--unknown"])  # argparse's exit, status 2
""")
    with pytest.raises(ConfigError, match=r"^script '.*train\.py' exited \(status 2\) as it was imported: "
                                          r"hvdazure imports it without running its"):
        trainer_class_in(script)
    assert trainer_class_in(_script(tmp_path, TRAINER.format(name="Other", base="TorchTrainer"), "ok.py"))


def test_a_trainer_another_one_extends_is_not_a_choice(tmp_path: Path) -> None:
    script = _script(tmp_path, TRAINER.format(name="Base", base="TorchTrainer") + """
class Regression(Base):
    pass
""")
    assert trainer_class_in(script).__name__ == "Regression"
    assert trainer_class_in(script, "Base").__name__ == "Base"  # --trainer may still name it


def test_a_trainer_imported_from_a_module_beside_the_script_is_found(tmp_path: Path) -> None:
    _script(tmp_path, TRAINER.format(name="ImportedTrainer", base="TorchTrainer"), "my_trainers.py")
    script = _script(tmp_path, """
from my_trainers import ImportedTrainer

if __name__ == "__main__":
    ImportedTrainer.main(epochs=3)
""")
    assert trainer_class_in(script).__name__ == "ImportedTrainer"


def test_several_trainers_are_one_line_naming_them_and_trainer_chooses(tmp_path: Path) -> None:
    script = _script(tmp_path, TRAINER.format(name="First", base="TorchTrainer")
                     + TRAINER.format(name="Second", base="TorchTrainer"))
    with pytest.raises(ConfigError) as refused:
        trainer_class_in(script)
    assert str(refused.value) == (f"{script} has several trainer classes (it has First, Second): choose one "
                                  "with --trainer NAME")
    assert trainer_class_in(script, "Second").__name__ == "Second"
    with pytest.raises(ConfigError, match=r"^--trainer 'Third': .* has no trainer class of that name "
                                          r"\(it has First, Second\)$"):
        trainer_class_in(script, "Third")


def test_a_script_without_a_trainer_or_missing_is_one_line(tmp_path: Path) -> None:
    script = _script(tmp_path, """
from hvdazure.torch import TorchTrainer  # hvdazure's own class is not the script's trainer

if __name__ == "__main__":
    class Hidden(TorchTrainer):  # not at the top level: never defined on import
        pass
""")
    with pytest.raises(ConfigError, match=r"has no trainer class: define a subclass of TorchTrainer or "
                                          r"TensorFlowTrainer at its top level"):
        trainer_class_in(script)
    with pytest.raises(ConfigError, match=r"^script '.*no_such\.py' not found$"):
        trainer_class_in(str(tmp_path / "no_such.py"))


# --- the config the model is built with -----------------------------------------------------------------
def test_the_model_is_built_with_the_checkpoints_config_under_config_and_set(tmp_path: Path) -> None:
    trained = TrainConfig(epochs=7, batch_size=16, checkpoint_dir="/elsewhere/ckpt",
                          extra={"hidden": 64, "depth": 3})
    checkpoints = _checkpoint(tmp_path / "ckpt", trained)
    (tmp_path / "cfg.yaml").write_text("batch_size: 4\n")
    request = ExportRequest(checkpoints, "latest", str(tmp_path / "model.onnx"))
    with pytest.raises(ConfigSeen) as built:
        export_checkpoint(_records_its_config, request,
                          ["--config", str(tmp_path / "cfg.yaml"), "--set", "extra.depth=5"],
                          defaults={"epochs": 2, "lr": 0.5, "extra": {"hidden": 8}})
    config = built.value.config
    assert config.epochs == 7 and config.lr == trained.lr  # the checkpoint's, over the script's defaults
    assert config.batch_size == 4 and config.extra == {"hidden": 64, "depth": 5}  # --config, --set over it
    assert config.checkpoint_dir == checkpoints  # the one named here, not where the run wrote it


def test_a_checkpoint_that_records_no_config_takes_the_scripts_defaults(tmp_path: Path) -> None:
    checkpoints = _checkpoint(tmp_path / "ckpt", None)
    with pytest.raises(ConfigSeen) as built:
        export_checkpoint(_records_its_config, ExportRequest(checkpoints, "latest", str(tmp_path / "m.onnx")),
                          defaults={"extra": {"hidden": 8}})
    assert built.value.config.extra == {"hidden": 8}


def test_a_scripts_export_mode_names_the_checkpoint_as_predict_and_test_do(tmp_path: Path) -> None:
    defaults = {"checkpoint_dir": str(tmp_path / "ckpt")}
    assert export_request("best", "m.onnx", [], defaults) == ExportRequest(str(tmp_path / "ckpt"), "best",
                                                                           "m.onnx")
    elsewhere = export_request("latest", "m.onnx", ["--set", "checkpoint_dir=other"], defaults)
    assert elsewhere.checkpoint == "other"
    one = export_request("run/step-00000040", "m.pt", [], defaults, format="torchscript", overwrite=True)
    assert one == ExportRequest("run/step-00000040", "latest", "m.pt", "torchscript", None, True)
    with pytest.raises(ConfigError, match=r"^export\(checkpoint='latest'\) needs checkpoint_dir in the "
                                          r"config, or give the checkpoint's path$"):
        export_request("latest", "m.onnx", [], {})


# --- refusals, before any rank starts ---------------------------------------------------------------------
@pytest.fixture()
def regression(tmp_path: Path) -> type:
    return trainer_class_in(_script(tmp_path, TRAINER.format(name="Regression", base="TorchTrainer")))


def test_an_existing_output_is_refused_unless_overwrite(tmp_path: Path, regression: type) -> None:
    output = tmp_path / "model.onnx"
    output.write_bytes(b"the deployed model")
    request = ExportRequest(str(tmp_path / "no_checkpoints"), "latest", str(output))
    with pytest.raises(ConfigError, match=r"^output '.*model\.onnx' exists: give --overwrite to replace it$"):
        export_checkpoint(regression, request)
    assert output.read_bytes() == b"the deployed model"
    with pytest.raises(CheckpointError):  # with overwrite it goes on, to the (missing) checkpoint
        export_checkpoint(regression, ExportRequest(request.checkpoint, "latest", str(output),
                                                    overwrite=True))


def test_an_output_where_nothing_can_be_written_is_refused_first(tmp_path: Path, regression: type) -> None:
    (tmp_path / "a_file").write_text("")
    request = ExportRequest(str(tmp_path / "no_checkpoints"), "latest", str(tmp_path / "a_file" / "m.onnx"))
    with pytest.raises(ConfigError, match=r"^output '.*m\.onnx': '.*a_file' is a file, not a folder$"):
        export_checkpoint(regression, request)
    with pytest.raises(ConfigError, match=r"^output 'abfs://models/m\.onnx': export writes a local path"):
        export_checkpoint(regression, ExportRequest(request.checkpoint, "latest", "abfs://models/m.onnx"))


def test_a_missing_or_damaged_checkpoint_is_one_line(tmp_path: Path, regression: type) -> None:
    output = str(tmp_path / "model.onnx")
    with pytest.raises(CheckpointError, match=r"^.*no_such: no such directory$"):
        export_checkpoint(regression, ExportRequest(str(tmp_path / "no_such"), "latest", output))
    one = Path(_checkpoint(tmp_path / "ckpt", TrainConfig())) / "step-00000001"
    (one / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"manifest\.json is not valid JSON") as refused:
        export_checkpoint(regression, ExportRequest(str(one), "latest", output))
    assert "\n" not in str(refused.value)
    assert not Path(output).exists()


def test_an_unknown_config_field_is_one_line(tmp_path: Path, regression: type) -> None:
    request = ExportRequest(_checkpoint(tmp_path / "ckpt", TrainConfig()), "latest", str(tmp_path / "m.onnx"))
    with pytest.raises(ConfigError, match=r"^unknown config field 'epoch'; did you mean 'epochs'\?$"):
        export_checkpoint(regression, request, ["--set", "epoch=3"])


@pytest.mark.parametrize(("output", "format", "message"), [
    ("model.keras", None, "output '{o}': its name does not say a format the torch binding writes; give "
                          "--format: onnx, torchscript, exported_program"),
    ("model.bin", None, "output '{o}': its name does not say a format the torch binding writes; give "
                        "--format: onnx, torchscript, exported_program"),
    ("model.onnx", "saved_model", "format 'saved_model': the torch binding writes onnx, torchscript, "
                                  "exported_program"),
])
def test_a_format_the_trainers_binding_does_not_write_is_refused(tmp_path: Path, regression: type,
                                                                 output: str, format: str | None,
                                                                 message: str) -> None:
    request = ExportRequest(_checkpoint(tmp_path / "ckpt", TrainConfig()), "latest", str(tmp_path / output),
                            format)
    with pytest.raises(ExportError) as refused:
        export_checkpoint(regression, request)
    assert str(refused.value) == message.format(o=tmp_path / output)


def test_several_ranks_are_refused(tmp_path: Path, regression: type, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=r"^export runs in one process, and this is one of 2 ranks "
                                          r"\(openmpi\): run it without a launcher$"):
        export_checkpoint(regression, ExportRequest(str(tmp_path), "latest", str(tmp_path / "m.onnx")))


def test_the_example_is_read_from_npy_or_npz_in_the_order_saved(tmp_path: Path) -> None:
    one, two = np.arange(6.0).reshape(2, 3), np.ones((2, 1), np.int64)
    np.save(tmp_path / "x.npy", one)
    np.savez(tmp_path / "xs.npz", features=one, ids=two)
    (x,) = read_example(str(tmp_path / "x.npy"))
    features, ids = read_example(str(tmp_path / "xs.npz"))
    assert np.array_equal(x, one) and np.array_equal(features, one) and np.array_equal(ids, two)
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    for name, message in [("x.csv", r"a \.npy file \(the model's input\) or \.npz"),
                          ("missing.npy", "no such file"), ("bad.npy", "is not a NumPy file")]:
        with pytest.raises(ConfigError, match=message):
            read_example(str(tmp_path / name))


# --- the command line --------------------------------------------------------------------------------
def test_the_command_fails_in_one_line_with_exit_status_2_and_json(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = cli_main(["export", str(tmp_path), str(tmp_path / "m.onnx"), "--script",
                           str(tmp_path / "no_such.py"), "--json"])
    assert status == 2
    assert err.getvalue() == f"hvdazure: error: script '{tmp_path / 'no_such.py'}' not found\n"
    assert json.loads(out.getvalue()) == {"error": f"script '{tmp_path / 'no_such.py'}' not found",
                                          "exit_code": 2}
    assert os.listdir(tmp_path) == []


def test_the_scripts_export_mode_fails_with_exit_status_2_as_the_command_does(
        tmp_path: Path, regression: type[Trainer]) -> None:
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as exited:
        regression.main(["export", "--checkpoint", str(tmp_path / "no_such"), "--output",
                         str(tmp_path / "m.onnx")])
    assert exited.value.code == 2  # as `hvdazure export` ends on a checkpoint that is missing
    assert err.getvalue() == f"hvdazure: error: {tmp_path / 'no_such'}: no such directory\n"
    assert os.listdir(tmp_path) == ["train.py"]
