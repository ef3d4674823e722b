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


def test_predictions_of_a_sharded_dataset_written_as_shards_to_blob_are_the_same_at_3_ranks_as_at_1(
        blob_url, tmp_path):
    """trainer.predict(ShardedDataset on Blob, output=abfs://...): 3 ranks (after training, Gloo) and 1
    rank (from the checkpoint, MPI) write datasets of the same samples, in the source's order, each the
    same bytes as the in-memory predictions (37 samples in batches of 4: 4, 3 and 3 batches a rank)."""
    from hvdazure.data import ShardedDataset

    source = write_regression_shards(f"{blob_url}/data")
    forget_filesystems()
    checkpoints = tmp_path / "ckpt"
    common = ("epochs=1", "lr=0.05", "batch_size=4", "extra.framework=torch", f"extra.data={source}",
              f"checkpoint_dir={checkpoints}")
    runs = {"three": (3, "gloo", (f"extra.predict_to={blob_url}/p3",)),
            "one": (1, "mpi", (f"extra.predict_to={blob_url}/p1", f"extra.predict_from={checkpoints}"))}
    jobs = {}
    for name, (np_, controller, settings) in runs.items():
        out = tmp_path / name
        out.mkdir()
        jobs[name] = run_job(JOB, *[a for s in (*common, *settings) for a in ("--set", s)], out_dir=out,
                             np=np_, controller=controller, timeout=180)
        assert jobs[name].returncode == 0, jobs[name].output

    reference = jobs["one"].reports[0]["in_memory"]
    assert reference["index"] == list(range(NUM_SAMPLES))
    for name in runs:
        for report in jobs[name].reports.values():
            assert report["in_memory"] == reference and report["written_samples"] == NUM_SAMPLES
        url = f"{blob_url}/p{3 if name == 'three' else 1}"
        written = ShardedDataset(url, cache_dir=str(tmp_path / name / "cache"))
        samples = [written[i] for i in range(len(written))]
        assert [s["index"] for s in samples] == reference["index"]
        assert [s["y"].tolist() for s in samples] == reference["y"]  # float64, exactly
