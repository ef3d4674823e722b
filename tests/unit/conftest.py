"""The unit tests, one folder per area of the package (CONTRIBUTING.md, "The tests"), each with a conftest.py
holding the fixtures only that area uses; what several areas share is here, and the plain helpers several
folders import (fake_cuda.py, version_pins.py) sit beside this file, which puts this folder on sys.path.

The folders are not packages (pytest's default `prepend` import mode): a test file's name must be unique
under tests/unit, and a folder is never named after an importable package (azure, torch, tensorflow).
A fixture costs only the tests that ask for it by name (none is autouse), so the suite's time does not grow
with what is shared. Fixture here: `project`, the project folder every Azure submission test starts from.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_UNIT = str(Path(__file__).resolve().parent)
if _UNIT not in sys.path:
    sys.path.insert(0, _UNIT)

from azure_project import make_project  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "project(files=None, v1=False, script='train.py', under=None): how the `project` fixture "
                   "lays out its folder (tests/unit/conftest.py)")


@pytest.fixture
def project(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path/project made by make_project (azure_project.py) and made the working directory, laid out as
    the closest `project` mark says: on a test or, for every test of a module, in its `pytestmark`.

    `files`, `v1` and `script` are make_project's; `under` moves the project, its HOME and its cache into
    that folder of tmp_path (tmp_path/<under>/project)."""
    mark = request.node.get_closest_marker("project")
    layout = dict(mark.kwargs) if mark is not None else {}
    under = layout.pop("under", None)
    return make_project(tmp_path / under if under else tmp_path, monkeypatch, **layout)
