"""A ShardedDataset on Azure Blob (Azurite), on 2 real ranks of one node, under Gloo and MPI: the shards come
through the node's cache, each downloaded once for both ranks, and every sample is trained on once per
epoch."""

from __future__ import annotations

from pathlib import Path

import pytest
from distributed.harness import CONTROLLERS, run_job
from distributed.sharded_data import NUM_SAMPLES, SHARD_SIZES, write_regression_shards

from storage.azurite import forget_filesystems

pytestmark = pytest.mark.distributed

JOB = Path(__file__).resolve().parents[1] / "distributed" / "workers" / "sharded_job.py"


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_two_ranks_of_a_node_download_each_shard_once_and_train_every_sample_once(blob_url, tmp_path,
                                                                                  controller):
    source = write_regression_shards(f"{blob_url}/train")  # shards and index written to Blob (ETags)
    forget_filesystems()
    out = tmp_path / "out"
    out.mkdir()
    settings = ("epochs=2", "lr=0.05", "batch_size=4", "extra.framework=torch", f"extra.data={source}",
                f"extra.cache_dir={tmp_path / 'node-cache'}")

    job = run_job(JOB, *[a for s in settings for a in ("--set", s)], out_dir=out, np=2, controller=controller,
                  timeout=180)

    assert job.returncode == 0, job.output
    reports = job.reports.values()
    downloads = sum(r[kind]["downloads"] for r in reports for kind in ("cache", "eval_cache"))
    assert downloads == len(SHARD_SIZES), [(r["cache"], r["eval_cache"]) for r in reports]
    for epoch in ("0", "1"):
        assert sorted(i for r in reports for i in r["seen"][epoch]) == list(range(NUM_SAMPLES)), epoch
    assert len(list((tmp_path / "node-cache").rglob("*.tar"))) == len(SHARD_SIZES)
