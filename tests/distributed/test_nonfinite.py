"""A loss that turns NaN on one rank (config field on_nan_loss; core/nonfinite.py): with `stop` every rank
stops together with one line and exit status 1, and no checkpoint of non-finite weights is written; with
`skip` the run trains to the end with finite weights and says what it skipped. Both frameworks
(TensorFlow: the record is kept inside the compiled step), on 2 ranks (NaN on rank 1 only) and on 1
process."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from harness import run_job, set_args

JOB = "nonfinite_job.py"
FRAMEWORKS = ("torch", "tensorflow")
TIMEOUT = 300  # generous: the machine is shared; a job here takes 10-30 s
# 37 samples, batch 2 on 2 ranks: 10 steps an epoch; step 6 on rank 1 is the first NaN; checkpoints every
# 4 steps; the metrics are reduced every 10 steps, so the NaN is found at the checkpoint due at step 8
TWO_RANKS = ("epochs=2", "batch_size=2", "log_every=10", "checkpoint_every_steps=4", "extra.nan_rank=1",
             "extra.nan_step=6")


def model_weights(checkpoint: Path, framework: str) -> list[np.ndarray]:
    """The model's weights a checkpoint holds, read as the files they are."""
    if framework == "torch":
        import torch

        return [t.numpy() for t in torch.load(checkpoint / "model.pt", weights_only=True).values()]
    with np.load(checkpoint / "model.npz", allow_pickle=False) as stored:
        return [stored[name] for name in stored.files if name != "paths"]


def assert_every_checkpoint_finite(directory: Path, framework: str) -> list[str]:
    names = sorted(p.name for p in directory.glob("step-*"))
    assert names, f"no checkpoint in {directory}"
    for name in names:
        assert all(np.isfinite(w).all() for w in model_weights(directory / name, framework)), name
    return names


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_nan_loss_on_one_rank_stops_every_rank_with_one_line_and_no_checkpoint_of_nan_weights(
        tmp_path, framework):
    # was: every log line said `loss nan`, exit 0, and checkpoints of NaN weights became `latest`
    checkpoints = tmp_path / "checkpoints"
    job = run_job(JOB, framework, *set_args([*TWO_RANKS, f"checkpoint_dir={checkpoints}"]), out_dir=tmp_path,
                  timeout=TIMEOUT)

    assert job.returncode == 1, job.output
    line = ("hvdazure: error: training_step returned a non-finite loss (nan) at step 6 on rank 1; stopped "
            "all ranks at step 8 (the weights of step 5 were the last finite ones); the newest finite "
            "checkpoint is step-00000004")
    assert line in job.stderr, job.output
    assert "Traceback" not in job.output and "loss nan" not in job.output
    assert not job.reports  # no rank went on past fit()
    assert (checkpoints / "latest").read_text().strip() == "step-00000004"
    assert assert_every_checkpoint_finite(checkpoints, framework) == ["step-00000004"]


@pytest.mark.parametrize("framework", [*FRAMEWORKS, "torch-zero_stage=2"])
def test_skip_trains_to_the_end_with_finite_weights_and_says_which_steps_it_skipped(tmp_path, framework):
    """(torch-zero_stage=2: sharded, the NaN reaches every rank's slice through the reduce-scatter, and the
    slices' probe every rank's scaler)"""
    framework, *sharded = framework.split("-")
    checkpoints = tmp_path / "checkpoints"
    settings = [*TWO_RANKS, "log_every=5", "extra.nan_steps=2", "on_nan_loss=skip",
                f"checkpoint_dir={checkpoints}", *sharded]
    job = run_job(JOB, framework, *set_args(settings), out_dir=tmp_path, timeout=TIMEOUT)

    assert job.returncode == 0, job.output
    assert ("skipped 2 step(s) whose gradients were not finite, up to step 8 (2 in this run so far"
            in job.stderr), job.output
    assert job.stderr.count("skipped ") == 1, job.output  # steps 6 and 7, read before the save at step 8
    first, second = job.reports[0], job.reports[1]
    assert first["finite"] and first["params"] == second["params"]
    assert [record["step"] for record in first["history"]] == [10, 20]
    assert all(math.isfinite(record["train_loss"]) for record in first["history"]), first["history"]
    assert assert_every_checkpoint_finite(checkpoints, framework)[-1] == "step-00000020"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_on_one_process_skip_trains_on_and_stop_names_rank_0_without_checkpoints(tmp_path, framework):
    runs = {"skip": ["batch_size=4", "extra.nan_step=3", "extra.nan_steps=1", "on_nan_loss=skip"],
            "stop": ["batch_size=4", "log_every=4", "extra.nan_step=3"]}
    for name in runs:
        (tmp_path / name).mkdir()
    spec = tmp_path / "runs.json"
    spec.write_text(json.dumps(runs))
    job = run_job(JOB, framework, "--runs", str(spec), out_dir=tmp_path, np=1, timeout=TIMEOUT)

    assert job.returncode == 1, job.output
    skipped = json.loads((tmp_path / "skip" / "rank-0.json").read_text())
    assert skipped["finite"] and math.isfinite(skipped["history"][-1]["train_loss"])
    assert "skipped 1 step(s) whose gradients were not finite, up to step 3" in job.stderr, job.output
    assert ("hvdazure: error: training_step returned a non-finite loss (nan) at step 3 on rank 0; stopped "
            "all ranks at step 4 (the weights of step 2 were the last finite ones); no checkpoint was "
            "written (checkpoint_dir is not set)") in job.stderr, job.output
    assert "Traceback" not in job.output
    assert not (tmp_path / "stop" / "rank-0.json").exists()
