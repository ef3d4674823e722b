"""Fixtures of the unit tests: `project`, the project folder every Azure submission test starts from, and
`checkpoint_dir`, a fresh in-memory checkpoint folder.

A fixture here costs only the tests that ask for it by name (none is autouse), so the suite's time does not
grow with what is shared here. Plain builders live in modules of their own (azure_project.py, job_specs.py,
shard_files.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure_project import make_project


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


@pytest.fixture
def checkpoint_dir() -> Iterator[str]:
    """A fresh memory:// folder for the trainer's checkpoints (fsspec's in-memory filesystem, shared by the
    threads of a fake-rank job), removed after the test."""
    import fsspec

    url = f"memory://fake-ranks-{uuid.uuid4().hex}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)
