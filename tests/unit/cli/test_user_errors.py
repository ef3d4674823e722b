"""A mistake in what a script gives hvdazure ends it as one line wherever it is found: before `fit()` too
(a TrainConfig built with a misspelt field, `load_weights` of a missing directory), in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hvdazure.core.backend import DataError
from hvdazure.core.checkpoint.store import CheckpointError
from hvdazure.core.config import ConfigError


def _run(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "script.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def test_a_misspelt_field_at_the_top_of_a_script_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    done = _run(tmp_path, "from hvdazure import TrainConfig\nTrainConfig(epoch=3)\n")

    assert done.returncode == 2, done.stderr
    assert done.stderr == "hvdazure: error: unknown config field 'epoch'; did you mean 'epochs'?\n"


def test_load_weights_of_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    done = _run(tmp_path, "from hvdazure.torch import load_weights\nload_weights('nope_dir', 'best')\n")

    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("hvdazure: error: nope_dir: no such directory"), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_other_exceptions_keep_their_traceback(tmp_path: Path) -> None:
    done = _run(tmp_path, "import hvdazure\nraise ValueError('mine')\n")

    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr and "ValueError: mine" in done.stderr


@pytest.mark.parametrize(("kind", "status"), [(ConfigError, 2), (DataError, 2), (CheckpointError, 1)])
def test_every_user_error_is_one_kind_with_its_exit_status(kind: type[Exception], status: int) -> None:
    from hvdazure.core.errors import UserError

    assert issubclass(kind, UserError) and kind.exit_status == status  # type: ignore[attr-defined]
