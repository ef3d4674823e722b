"""The project folder every Azure submission test starts from: a code directory holding a training script
(and what else a test names), made the current directory, with the dry run's default output folder and,
for SDK v1, azureml-core's snapshot cache kept under the test's tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

TRAIN = "print('training')\n"


def make_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str | bytes] | None = None,
                 v1: bool = False, script: str | None = "train.py") -> Path:
    """tmp_path/project with the training `script` (None: none) and `files` (relative path -> text or
    bytes), as the working directory. `v1`: HOME moved under tmp_path too (azureml-core caches snapshots
    under ~/.azureml)."""
    if v1:
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        (tmp_path / "home" / ".azureml").mkdir(parents=True)
    directory = tmp_path / "project"
    directory.mkdir(parents=True)
    for name, content in {**({script: TRAIN} if script else {}), **(files or {})}.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    monkeypatch.chdir(directory)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where a dry run writes by default
    return directory
