"""Fixtures of the loop's tests: `checkpoint_dir`, a fresh in-memory checkpoint folder for the real loop on
simulated ranks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest


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
