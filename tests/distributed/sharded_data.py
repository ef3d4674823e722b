"""Sharded regression data for the sharded-training tests: WebDataset tar shards of uneven sizes and their
hvdazure index, written once per test session and read by the worker scripts (workers/sharded_job.py).

Sample i: `index.cls` = i, `x.npy` (3 float64 features), `y.npy` (1 float64 target), all drawn from one seed,
so every job reads the same numbers."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np

SHARD_SIZES = (8, 3, 10, 9, 7)  # 37 samples: uneven, and shards smaller than a global batch of 8
NUM_SAMPLES = sum(SHARD_SIZES)


def regression(n: int, features: int = 3, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features))
    y = x @ rng.normal(size=(features, 1)) + 0.1 * rng.normal(size=(n, 1))
    return x, y


def _member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def write_regression_shards(directory: Path, shard_sizes: tuple[int, ...] = SHARD_SIZES) -> Path:
    """Write the shards and their index into `directory`; returns it."""
    from hvdazure.data import build_index

    directory.mkdir(parents=True, exist_ok=True)
    x, y = regression(sum(shard_sizes))
    sample = 0
    for number, size in enumerate(shard_sizes):
        with tarfile.open(directory / f"shard-{number:05d}.tar", "w", format=tarfile.USTAR_FORMAT) as archive:
            for i in range(sample, sample + size):
                _member(archive, f"{i:06d}.index.cls", str(i).encode())
                _member(archive, f"{i:06d}.x.npy", _npy(x[i]))
                _member(archive, f"{i:06d}.y.npy", _npy(y[i]))
        sample += size
    build_index(str(directory), progress=False)
    return directory
