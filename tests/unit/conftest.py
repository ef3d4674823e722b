"""The unit tests, one folder per area of the package (CONTRIBUTING.md, "The tests"), each with a conftest.py
holding the fixtures only that area uses; what several areas share is here, and the plain helpers several
folders import (fake_cuda.py, version_pins.py) sit beside this file, which puts this folder on sys.path.

The folders are not packages (pytest's default `prepend` import mode): a test file's name must be unique
under tests/unit, and a folder is never named after an importable package (azure, torch, tensorflow).
A fixture costs only the tests that ask for it by name (none is autouse), so the suite's time does not grow
with what is shared (`shards`, the data's and core's).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_UNIT = str(Path(__file__).resolve().parent)
if _UNIT not in sys.path:
    sys.path.insert(0, _UNIT)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The regression set of tests/distributed/sharded_data.py in tar shards, written once per test module."""
    from distributed.sharded_data import write_regression_shards

    return write_regression_shards(tmp_path_factory.mktemp("shards"))
