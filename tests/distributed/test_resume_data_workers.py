"""DataLoader worker processes (num_workers > 0) across a stop mid-epoch and a resume, on real ranks."""

import json

from harness import run_job

JOB = "torch_job.py"
# 33 samples, batch 4 on 2 ranks: 5 steps per epoch, the last one a single sample (rank 1's share empty).
# Stopping at step 7 leaves epoch 2 two steps in.
BASE = ("epochs=3", "batch_size=4", "extra.n_train=33", "lr=0.05")


def train(tmp_path, name, *settings):
    out = tmp_path / name
    out.mkdir()
    job = run_job(JOB, *[arg for s in settings for arg in ("--set", s)], out_dir=out, timeout=180)
    assert job.returncode == 0, job.output
    assert sorted(job.reports) == [0, 1], job.output
    return job


def test_a_run_with_data_workers_stopped_mid_epoch_resumes_to_the_uninterrupted_result(tmp_path):
    ckpt = tmp_path / "ckpt"
    reference = train(tmp_path, "reference", *BASE, "num_workers=0").reports
    first = train(tmp_path, "first", *BASE, "num_workers=2", f"checkpoint_dir={ckpt}", "max_steps=7")
    second = train(tmp_path, "second", *BASE, "num_workers=2", f"checkpoint_dir={ckpt}", "resume=auto")

    manifest = json.loads((ckpt / "step-00000007" / "manifest.json").read_text())
    assert manifest["epoch"] == 1 and manifest["samples_in_epoch"] == 16  # stopped mid-epoch
    assert "resumed from step-00000007" in second.stderr
    for epoch in ("0", "1", "2"):  # every sample once in every epoch, the stop and resume included
        used = [i for job in (first, second) for r in job.reports.values() for i in r["seen"].get(epoch, [])]
        assert sorted(used) == list(range(33)), epoch
    # float64 on CPU, the same batches in the same order: bit for bit
    assert second.reports[0]["params_sha256"] == reference[0]["params_sha256"]
    assert second.reports[1]["params_sha256"] == reference[0]["params_sha256"]
    assert second.reports[0]["history"] == reference[0]["history"]
