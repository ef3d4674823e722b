"""Fixtures of the loop's tests: `checkpoint_dir`, a fresh in-memory checkpoint folder for the real loop on
simulated ranks; `rank0_log`, the lines the `hvdazure` logger writes."""

from __future__ import annotations

import logging
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


@pytest.fixture
def rank0_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The lines the `hvdazure` logger writes (rank 0's callbacks log; every thread rank is let through)."""
    monkeypatch.setenv("HVDAZURE_LOG_ALL_RANKS", "1")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("hvdazure").addHandler(handler)
    yield lines
    logging.getLogger("hvdazure").removeHandler(handler)
