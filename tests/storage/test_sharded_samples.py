"""The sharded-data samples as a user runs them: samples/pack_digits.py writes the digits into shards,
locally and on Blob (Azurite), and each trainer's sample trains on them with 2 ranks to a sensible
accuracy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from distributed.harness import run_job

pytestmark = pytest.mark.distributed
SAMPLES = Path(__file__).resolve().parents[2] / "samples"


def pack(output: str, *args: str) -> None:
    proc = subprocess.run([sys.executable, str(SAMPLES / "pack_digits.py"), output, *args],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "train: " in proc.stdout and "eval: 359 samples" in proc.stdout


def final_accuracy(stdout: str) -> float:
    final = [line for line in stdout.splitlines() if "final: eval accuracy" in line]
    assert len(final) == 1, stdout  # printed by rank 0 only
    return float(final[0].split("eval accuracy ")[1].split(",")[0])


def test_the_torch_sample_trains_on_local_tar_shards_with_dataloader_workers(tmp_path: Path) -> None:
    pack(str(tmp_path / "digits"))
    job = run_job(SAMPLES / "torch_sharded_digits.py", "--set", f"extra.data={tmp_path / 'digits'}",
                  "--set", "epochs=3", out_dir=tmp_path, timeout=240)

    assert job.returncode == 0, job.output
    assert final_accuracy(job.stdout) >= 0.9


def test_the_tensorflow_sample_trains_on_tfrecord_shards_in_blob_storage(blob_url: str,
                                                                         tmp_path: Path) -> None:
    pack(f"{blob_url}/digits-tfr", "--format", "tfrecord")
    job = run_job(SAMPLES / "tf_sharded_digits.py", "--set", f"extra.data={blob_url}/digits-tfr",
                  "--set", "epochs=3",
                  out_dir=tmp_path, timeout=240, env={"HVDAZURE_CACHE_DIR": str(tmp_path / "cache")})

    assert job.returncode == 0, job.output
    assert final_accuracy(job.stdout) >= 0.9
    cached = list((tmp_path / "cache").rglob("*.tfrecord*"))
    assert cached, "the shards were read through the node's cache"
