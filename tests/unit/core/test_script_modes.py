"""core/script/modes.py: the command line of a script run by Trainer.main(), and its output files."""

import json
import os

import numpy as np
import pytest

from hvdazure.core.config import ConfigError
from hvdazure.core.script.modes import ScriptCommand, parse_command, write_output


@pytest.mark.parametrize(("argv", "expected"), [
    ([], ScriptCommand("fit", None, None, [])),
    (["--set", "epochs=2"], ScriptCommand("fit", None, None, ["--set", "epochs=2"])),
    (["fit", "--config", "cfg.yaml"], ScriptCommand("fit", None, None, ["--config", "cfg.yaml"])),
    (["test", "--checkpoint", "best", "--set", "batch_size=4"],
     ScriptCommand("test", "best", None, ["--set", "batch_size=4"])),
    (["predict", "--set", "a=1", "--checkpoint", "abfs://c/ckpt", "--output", "p.npz"],
     ScriptCommand("predict", "abfs://c/ckpt", "p.npz", ["--set", "a=1"])),
    (["predict", "--output", "abfs://c/predictions.v2"], ScriptCommand("predict", None,
                                                                     "abfs://c/predictions.v2", [])),
    (["predict", "--output", "out/predictions"], ScriptCommand("predict", None, "out/predictions", [])),
    (["export", "--checkpoint", "best", "--output", "m.onnx", "--set", "a=1"],
     ScriptCommand("export", "best", "m.onnx", ["--set", "a=1"])),
    (["export", "--checkpoint", "ckpt", "--output", "serving", "--format", "saved_model", "--example",
      "x.npy", "--overwrite"], ScriptCommand("export", "ckpt", "serving", [], "saved_model", "x.npy", True)),
])
def test_the_mode_and_its_options_are_taken_out_and_the_rest_is_the_configs(argv, expected, tmp_path,
                                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_command(argv) == expected


@pytest.mark.parametrize(("argv", "message"), [
    (["train"], "unknown mode 'train': the first argument is one of fit, test, predict, export "
                "(default fit)"),
    (["--checkpoint", "best"], "--checkpoint is for test, predict and export; fit resumes with --set "
                               "resume=auto"),
    (["predict", "--checkpoint", "best"], "predict needs --output: FILE.npz (rank 0 writes the predictions), "
                                          "or a new directory or URL for shards"),
    (["predict", "--output", "p.csv"], "--output 'p.csv': predictions go to a .npz (.npy: one array) file, "
                                       "or to a directory or URL without an extension (shards)"),
    (["test", "--output", "m.npz"], "--output 'm.npz': test metrics are written as .json"),
    (["predict", "--checkp", "best", "--output", "p.npz"], None),  # no abbreviation: left to the config
    (["export", "--output", "m.onnx"], "export needs --checkpoint (latest, best or a path) and --output"),
    (["export", "--checkpoint", "best"], "export needs --checkpoint (latest, best or a path) and --output"),
])
def test_a_bad_command_line_is_one_line_naming_it(argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if message is None:
        assert parse_command(argv).config_args == ["--checkp", "best"]  # TrainConfig.from_cli refuses it
        return
    with pytest.raises(ConfigError) as raised:
        parse_command(argv)
    assert str(raised.value).startswith(message)


def test_an_output_that_is_a_directory_is_refused_before_anything_runs(tmp_path):
    (tmp_path / "p.npz").mkdir()
    with pytest.raises(ConfigError, match="is a directory: give a file name"):
        parse_command(["predict", "--output", str(tmp_path / "p.npz")])


def test_outputs_are_written_whole_in_the_format_their_name_says(tmp_path):
    write_output(str(tmp_path / "a" / "p.npz"), {"index": np.arange(3), "y": np.ones((3, 1))})
    write_output(str(tmp_path / "one.npz"), np.arange(4.0))
    write_output(str(tmp_path / "one.npy"), np.arange(4.0))
    write_output(str(tmp_path / "m.json"), {"loss": 0.5})
    with np.load(tmp_path / "a" / "p.npz") as stored:
        assert stored["index"].tolist() == [0, 1, 2]
    with np.load(tmp_path / "one.npz") as stored:
        assert stored.files == ["predictions"]
    assert np.load(tmp_path / "one.npy").tolist() == [0.0, 1.0, 2.0, 3.0]
    assert json.loads((tmp_path / "m.json").read_text()) == {"loss": 0.5}
    with pytest.raises(ConfigError, match=r"predict_step returns a dict of \['y'\]: write .npz"):
        write_output(str(tmp_path / "d.npy"), {"y": np.ones(2)})
    assert not (tmp_path / "d.npy").exists()
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]  # no temporary file left
