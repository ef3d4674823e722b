"""fit() called again on the same trainer goes on with the same run, on both real bindings (one process,
1 rank: the loop's logic is proven on simulated ranks in tests/unit/loop/test_loop_fake_ranks.py)."""

import os
import subprocess
import sys

import pytest
from distributed.harness import REPO, WORKERS, read_reports


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "torch-zero_stage=2"])
def test_a_second_fit_with_more_epochs_ends_bit_identical_to_one_longer_fit(tmp_path, framework):
    """(torch-zero_stage=2: both trainers with a sharded optimizer, whose state the first fit()'s checkpoint
    streamed and the second fit() goes on with)"""
    proc = subprocess.run([sys.executable, str(WORKERS / "fit_again.py"), *framework.split("-")], cwd=REPO,
                          env={**os.environ, "HVDAZURE_TEST_OUT": str(tmp_path)}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    report = read_reports(tmp_path)[0]
    again, whole = report["again"], report["whole"]
    assert again["params_sha256"] == whole["params_sha256"]  # was: the second fit() rebuilt the model
    assert again["history"] == whole["history"] and again["lrs"] == whole["lrs"]
    assert len(report["run_ids"]) == 3 and len(set(report["run_ids"])) == 1
    assert report["refused"].startswith("config field 'epochs': this trainer has trained its 3 epochs")
    assert "fit() again: the run goes on from epoch 2, step 10" in proc.stderr
    assert report["sharded_optimizer_freed"]  # was: kept until the process exits (atexit held it)
