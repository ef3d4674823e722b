"""Keras 3 `model.fit` on 2 real Horovod ranks with hvdazure.tensorflow.keras: data_parallel, shard_for_fit,
shard_for_evaluate and the callbacks (BroadcastInitialState, MetricAverage, LearningRateSchedule,
Checkpoint).

One float64 regression job (workers/keras_fit_job.py: 33 samples in batches of 4 per rank, so the last
step of each epoch has 1 sample and one rank none; 5 evaluation samples) is run once and read by the tests
below; the digits sample is run as a user would run it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from harness import REPO, run_job

from hvdazure.core.checkpoint.store import CheckpointManager
from hvdazure.core.sample_plan import epoch_permutation

EPOCHS, BATCH, LR, WARMUP, SEED, WORLD = 3, 4, 0.05, 3, 3, 2
N_TRAIN, N_EVAL = 33, 5
STEPS_PER_EPOCH = math.ceil(N_TRAIN / (BATCH * WORLD))


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("keras_fit")
    run = run_job("keras_fit_job.py", "--set", f"epochs={EPOCHS}", "--set", f"batch_size={BATCH}",
                  "--set", f"lr={LR}", "--set", f"warmup_steps={WARMUP}", "--set", "schedule=cosine",
                  "--set", f"seed={SEED}", out_dir=out, np=WORLD, timeout=240)
    assert run.returncode == 0, run.output
    assert sorted(run.reports) == [0, 1]
    return run.reports


def test_fit_ends_with_bit_identical_weights_on_every_rank(job):
    reports = job

    assert reports[0]["initial_weights"] == reports[1]["initial_weights"]  # each rank drew its own
    assert reports[0]["final_weights"] == reports[1]["final_weights"]
    assert reports[0]["final_weights"] != reports[0]["initial_weights"]


def test_predict_gives_every_rank_each_samples_prediction_once_in_order_as_one_rank_would(job):
    for rank in (0, 1):
        assert job[rank]["predictions_shape"] == [101, 1]
        assert job[rank]["predictions_as_alone"]  # byte for byte, float64


def test_epoch_metrics_are_the_ranks_sums_divided_once_and_identical_on_every_rank(job):
    reports = job
    metric_states = {"loss": "loss", "mae": "mean_absolute_error"}  # log name -> state variable prefix
    for phase, prefix, samples in (("train", "", N_TRAIN), ("val", "val_", N_EVAL)):
        for epoch in range(EPOCHS):
            local = [reports[rank][f"local_{phase}_states"][epoch] for rank in (0, 1)]
            for log_name, state in metric_states.items():
                total = local[0][f"{state}/total"] + local[1][f"{state}/total"]
                count = local[0][f"{state}/count"] + local[1][f"{state}/count"]
                assert count == samples  # each sample counted once: no padding, no repeats
                for rank in (0, 1):
                    assert reports[rank]["history"][prefix + log_name][epoch] == total / count


def test_lr_of_every_step_is_the_scaled_lr_after_linear_warmup_then_cosine(job):
    reports = job
    peak = LR * (BATCH * WORLD) / BATCH  # linear scaling: global batch 8 over base batch 4
    total = EPOCHS * STEPS_PER_EPOCH
    expected = [LR + (peak - LR) * step / WARMUP if step < WARMUP
                else 0.5 * peak * (1 + math.cos(math.pi * (step - WARMUP) / (total - WARMUP)))
                for step in range(total)]

    for rank in (0, 1):
        assert reports[rank]["lrs"] == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_two_ranks_train_exactly_as_one_process_with_the_global_batch(job):
    # The uneven last step (1 sample on rank 0, none on rank 1) must still give the mean over its samples.
    reports = job
    x, y = np.array(reports[0]["x"])[:N_TRAIN], np.array(reports[0]["y"])[:N_TRAIN]
    kernel, bias = (np.array(w) for w in reports[0]["initial_weights"])
    lrs = reports[0]["lrs"]
    step = 0
    for epoch in range(EPOCHS):
        order = epoch_permutation(N_TRAIN, SEED, epoch)
        for start in range(0, N_TRAIN, BATCH * WORLD):
            batch = order[start : start + BATCH * WORLD]
            error = x[batch] @ kernel + bias - y[batch]  # mean squared error's gradient, by hand
            kernel = kernel - lrs[step] * 2 * x[batch].T @ error / len(batch)
            bias = bias - lrs[step] * 2 * error.sum(axis=0) / len(batch)
            step += 1

    assert step == len(lrs)
    final_kernel, final_bias = (np.array(w) for w in reports[0]["final_weights"])
    np.testing.assert_allclose(final_kernel, kernel, rtol=0, atol=1e-10)
    np.testing.assert_allclose(final_bias, bias, rtol=0, atol=1e-10)


def test_checkpoints_are_written_by_rank_0_only_verified_and_hold_the_final_weights(job):
    # hvdazure.tensorflow.load_weights needs core's resolve_for_export, not there yet: the npz is read
    # through the CheckpointManager (verified against the manifest), as load_weights will.
    reports = job
    assert not Path(reports[1]["checkpoint_dir"]).exists()
    manager = CheckpointManager(reports[0]["checkpoint_dir"])

    kept = [c.step for c in manager.checkpoints()]
    assert kept == [2 * STEPS_PER_EPOCH, 3 * STEPS_PER_EPOCH]  # the last 2 epochs' (keep_last=2)
    run_ids = {c.run_id for c in manager.checkpoints()}
    assert len(run_ids) == 1 and None not in run_ids  # one run: retention, latest and best keep to it
    latest = manager.resolve("latest")
    assert latest.manifest["epoch"] == EPOCHS
    assert latest.manifest["metrics"]["val_loss"] == reports[0]["history"]["val_loss"][-1]
    with manager.local_files(latest, names=["model.npz"]) as paths, np.load(paths["model.npz"]) as stored:
        weights = [stored[f"{i:05d}"].tolist() for i in range(len(stored.files) - 1)]
    assert weights == reports[0]["final_weights"]


def test_a_save_failing_on_rank_0_is_the_same_checkpoint_error_on_every_rank_not_a_hang(job):
    reports = job
    kind, message = reports[0]["failed_save"]
    assert kind == "CheckpointError"
    assert message.startswith("checkpoint save in /proc/hvdazure-cannot-write-here failed: "), message
    assert reports[1]["failed_save"] == reports[0]["failed_save"]


def test_zero_stage_is_refused_in_one_line_on_every_rank_before_fit(job):
    # sharded optimizer state is PyTorch-only: was silently ignored, the whole state kept on every rank
    message = ("config field 'zero_stage': 1: sharded optimizer state is PyTorch-only for now; use "
               "zero_stage: 0 with model.fit")
    assert [job[rank]["sharding_refused"] for rank in (0, 1)] == [["ConfigError", message]] * 2


def test_digits_sample_reaches_95_percent_eval_accuracy_on_2_ranks(tmp_path):
    run = run_job(REPO / "samples" / "keras_fit_digits.py", out_dir=tmp_path, np=2, timeout=300)

    assert run.returncode == 0, run.output
    accuracy = float(re.search(r"final: eval accuracy ([0-9.]+)", run.stdout)[1])
    assert accuracy >= 0.95
