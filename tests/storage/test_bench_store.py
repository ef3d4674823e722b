"""`hvdazure bench checkpoint --url abfs://...` on Azurite, in its --quick configuration: save and load
on the store against the same bytes written and read with fsspec, in the shape of the local figures, and
nothing left behind in the container. No timing is asserted."""

import json
import math
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

from storage.azurite import forget_filesystems

pytestmark = pytest.mark.distributed


def test_bench_checkpoint_on_a_store_reports_save_and_load_against_the_stores_floor(
        blob_url: str, tmp_path: Path) -> None:
    url, out = f"{blob_url}/bench", tmp_path / "checkpoint.json"
    proc = subprocess.run([sys.executable, "-m", "hvdazure.cli", "bench", "checkpoint", "-np", "1", "--mpi",
                           "--quick", "--url", url, "--json", str(out)], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    result = json.loads(out.read_text())
    assert result["url"] == url and result["options"]["url"] == url
    times = result["save_load_s"]
    assert set(times) == {"write (fsspec)", "hvdazure save", "hvdazure save + retention", "read (fsspec)",
                          "hvdazure load"}
    assert all(len(values) == result["repeats"] and min(values) > 0 for values in times.values())
    summary = result["summary"]
    for figure in ("save_vs_floor", "save_with_retention_vs_floor", "load_vs_floor"):
        assert math.isfinite(summary[figure]["median"]) and summary[figure]["median"] > 0
    assert "hvdazure save / write (fsspec) (the store's floor)" in proc.stdout
    forget_filesystems()
    fs, container = fsspec.core.url_to_fs(blob_url)
    assert fs.find(container) == []  # the benchmark's folder is deleted


def test_bench_data_on_a_store_reads_each_shard_once_per_node_and_reports_every_figure(
        blob_url: str, tmp_path: Path) -> None:
    """Two ranks of one node share the cache: the bytes fetched in an epoch are the dataset's, once."""
    out = tmp_path / "data.json"
    proc = subprocess.run([sys.executable, "-m", "hvdazure.cli", "bench", "data", "-np", "2", "--quick",
                           "--url", blob_url, "--json", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["fetched_over_dataset"]["values"] == [1.0] * result["repeats"]
    assert summary["shards_touched"]["max_over_ideal"] <= 1.5
    assert sorted(r["samples"] for r in result["ranks"]) == [result["num_samples"] // 2] * 2
    for figure in ("cold_mb_s", "warm_mb_s", "raw_source_mb_s", "raw_local_mb_s", "warm_over_raw",
                   "wait_fraction", "resume_first_batch_s", "rss_4x_over_1x"):
        assert math.isfinite(summary[figure]["median"]) and summary[figure]["median"] > 0, figure
    assert "bytes fetched on the node per epoch / dataset: 1.00" in proc.stdout
    forget_filesystems()
    fs, container = fsspec.core.url_to_fs(blob_url)
    assert fs.find(container) == []  # the benchmark's dataset is deleted
