"""Fixtures of the Azure tests: `project`, the project folder every submission test starts from (laid out as
the closest `project` mark says); `fake`, a fake SDK v2 workspace serving the test (sdk_v2_fakes.py); and
`service`, the fake services SDK v1 calls (sdk_v1_fakes.py). The plain builders are modules beside this one:
azure_project.py, job_specs.py, sdk_v2_fakes.py, sdk_v1_fakes.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import responses
from azure_project import make_project

if TYPE_CHECKING:  # imported by the fixtures: sdk_v2_fakes makes a `project` mark, registered only below
    from sdk_v1_fakes import FakeService
    from sdk_v2_fakes import FakeWorkspace


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "project(files=None, v1=False, script='train.py', under=None): how the `project` fixture "
                   "lays out its folder (tests/unit/azure_ml/conftest.py)")


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
def fake() -> Iterator[FakeWorkspace]:
    """A FakeWorkspace (sdk_v2_fakes.py) whose blob store answers every blob request of the test."""
    from sdk_v2_fakes import BLOB_HOST, FakeWorkspace

    workspace = FakeWorkspace()
    with responses.RequestsMock(assert_all_requests_are_fired=False) as blob_store:
        for method in ("PUT", "HEAD", "GET"):
            blob_store.add_callback(method, BLOB_HOST, callback=workspace.blob)
        yield workspace


@pytest.fixture
def service() -> Iterator[FakeService]:
    """A FakeService (sdk_v1_fakes.py) answering every HTTPS request azureml-core makes in the test."""
    from sdk_v1_fakes import FakeService, serving

    fake = FakeService()
    with serving(fake):
        yield fake
