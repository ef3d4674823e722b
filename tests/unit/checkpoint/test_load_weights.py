"""hvdazure.torch.load_weights: every byte of the checkpoint is checked against its manifest before the
weights are returned, through the memory-mapped load."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hvdazure.core.checkpoint.store import CheckpointError, CheckpointManager
from hvdazure.torch import load_weights
from hvdazure.torch.checkpoint_content import MODEL_FILE, TorchCheckpointContent


def _save(directory: Path, step: int, value: float) -> str:
    model = torch.nn.Linear(64, 64)
    torch.nn.init.constant_(model.weight, value)
    content = TorchCheckpointContent(model, torch.optim.SGD(model.parameters(), lr=0.1), None,
                                     torch.device("cpu"))
    return CheckpointManager(str(directory)).save(step, content.save_files(copy=False), {}).name


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside the tensor data: torch.load itself would not notice
    path.write_bytes(bytes(data))


def test_load_weights_returns_the_saved_weights(tmp_path: Path) -> None:
    _save(tmp_path, 1, 0.5)
    weights = load_weights(str(tmp_path))
    assert torch.equal(weights["weight"], torch.full((64, 64), 0.5))


def test_a_flipped_byte_in_the_model_file_of_a_checkpoint_is_refused(tmp_path: Path) -> None:
    name = _save(tmp_path, 1, 0.5)
    _flip_a_byte(tmp_path / name / MODEL_FILE)
    with pytest.raises(CheckpointError, match="does not match"):
        load_weights(str(tmp_path / name))  # one checkpoint's directory
    with pytest.raises(CheckpointError, match="no valid checkpoint"):
        load_weights(str(tmp_path), "latest")


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path) -> None:
    _save(tmp_path, 1, 0.5)
    newest = _save(tmp_path, 2, 2.0)
    _flip_a_byte(tmp_path / newest / MODEL_FILE)
    assert torch.equal(load_weights(str(tmp_path))["weight"], torch.full((64, 64), 0.5))


def test_a_corrupt_optimizer_file_makes_the_checkpoint_invalid_too(tmp_path: Path) -> None:
    _save(tmp_path, 1, 0.5)
    newest = _save(tmp_path, 2, 2.0)
    (tmp_path / newest / "optimizer.pt").write_bytes(b"not the optimizer")
    assert torch.equal(load_weights(str(tmp_path))["weight"], torch.full((64, 64), 0.5))


def test_a_model_or_another_value_for_which_is_one_line(tmp_path: Path) -> None:
    _save(tmp_path, 1, 0.5)
    with pytest.raises(CheckpointError, match=r"^checkpoint='.*', which=a Linear: a checkpoint's path or URL "
                                              r"\(a str\) and which 'latest' or 'best'$"):
        load_weights(str(tmp_path), torch.nn.Linear(64, 64))  # type: ignore[arg-type]  # the model, by mistake
    with pytest.raises(CheckpointError, match=r"^checkpoint=a Linear, which='latest'"):
        load_weights(torch.nn.Linear(64, 64))  # type: ignore[arg-type]


def test_a_directory_of_checkpoints_named_as_one_says_to_add_latest(tmp_path: Path) -> None:
    _save(tmp_path / "ckpt", 1, 0.5)
    manager = CheckpointManager(str(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match=r"no manifest\.json: it is a directory of checkpoints; name "
                                              r"one of them, or .*ckpt/latest for the newest valid one$"):
        manager.open(str(tmp_path / "ckpt"))
