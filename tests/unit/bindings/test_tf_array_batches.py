"""TensorFlowTrainer's training batches (ArrayData.batches): small ones gathered when asked for, large ones
from a prefetching tf.data pipeline; either way the samples of each non-empty micro-batch, in plan order."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
from hvdazure.core.sample_plan import SamplePlan  # noqa: E402
from hvdazure.tensorflow import data as tf_data  # noqa: E402


@pytest.mark.parametrize("prefetch_above_bytes", [1 << 20, 0], ids=["gathered", "prefetched"])
def test_batches_are_the_planned_micro_batches_samples_in_order(monkeypatch, prefetch_above_bytes):
    monkeypatch.setattr(tf_data, "PREFETCH_ABOVE_BYTES", prefetch_above_bytes)
    rng = np.random.default_rng(0)
    arrays = tf_data.ArrayData({"x": rng.normal(size=(33, 4)), "index": np.arange(33)}, "train_dataset()")
    # 33 samples, global batch 16: the last step's single sample leaves rank 1 an empty micro-batch
    plan = SamplePlan(33, batch_size=4, world_size=2, rank=1, grad_accum_steps=2, seed=5)
    cells = [mb for step in plan.epoch(2) for mb in step]

    batches = list(arrays.batches(iter(cells)))

    planned = [mb.indices for mb in cells if not mb.is_empty]
    assert any(mb.is_empty for mb in cells)
    assert [np.asarray(b["index"]).tolist() for b in batches] == planned
    for batch, indices in zip(batches, planned, strict=True):
        np.testing.assert_array_equal(np.asarray(batch["x"]), arrays.structure["x"][indices])
