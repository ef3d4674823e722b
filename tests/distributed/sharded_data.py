"""Sharded regression data for the sharded-training tests: WebDataset tar shards and their hvdazure index,
written with hvdazure.data.write_shards once per test session and read by workers/sharded_job.py.

Sample i: `index` = i, `x` (3 float64 features), `y` (1 float64 target), drawn from one seed, so every job
reads the same numbers. 37 samples in shards of 8: 8, 8, 8, 8 and 5 (a last shard smaller than the rest)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

NUM_SAMPLES, SAMPLES_PER_SHARD = 37, 8
SHARD_SIZES = (8, 8, 8, 8, 5)


def regression(n: int, features: int = 3, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features))
    y = x @ rng.normal(size=(features, 1)) + 0.1 * rng.normal(size=(n, 1))
    return x, y


def write_regression_shards(directory: Path | str, samples_per_shard: int = SAMPLES_PER_SHARD,
                            num_samples: int = NUM_SAMPLES) -> Path | str:
    """Write the shards and their index into `directory` (a path, made if need be, or an fsspec URL);
    returns it."""
    from hvdazure.data import write_shards

    x, y = regression(num_samples)
    write_shards({"index": np.arange(num_samples), "x": x, "y": y}, str(directory), "tar",
                 samples_per_shard=samples_per_shard, progress=False)
    return directory
