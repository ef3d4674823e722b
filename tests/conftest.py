"""Every test tier can import the test doubles in tests/fakes/ as `fakes.<module>`, and shares `torch_runs`:
the runs of tests/distributed/workers/torch_job.py that tests in several folders start identically."""

import sys
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from distributed.harness import TorchRuns  # noqa: E402


@pytest.fixture(scope="session")
def torch_runs(tmp_path_factory: pytest.TempPathFactory) -> TorchRuns:
    """Each distinct run once per session (see TorchRuns): a reference run, or the first half of a resume."""
    return TorchRuns(tmp_path_factory.mktemp("torch-runs"))
