"""TorchTrainer on real ranks: what every data-parallel user relies on, asserted across processes."""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from harness import CONTROLLERS, REPO, WORKERS, read_reports, run_job

JOB = "torch_job.py"


def train(tmp_path, *settings, np=2, controller="gloo", name="run"):
    out = tmp_path / name
    out.mkdir()
    job = run_job(JOB, *[arg for s in settings for arg in ("--set", s)], out_dir=out, np=np,
                  controller=controller)
    assert job.returncode == 0, job.output
    assert sorted(job.reports) == list(range(np)), job.output
    return job.reports


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_parameters_are_bit_identical_across_ranks_after_training(tmp_path, controller):
    reports = train(tmp_path, "epochs=3", "batch_size=4", "extra.n_train=37", "lr=0.05", "warmup_steps=3",
                    "schedule=cosine", "grad_clip_norm=1.0", controller=controller)

    assert reports[0]["params_sha256"] == reports[1]["params_sha256"]
    assert reports[0]["history"] == reports[1]["history"]


@pytest.mark.parametrize(("settings", "name"), [
    ((), "plain"),
    (("grad_accum_steps=2",), "accumulation"),
    (("grad_clip_norm=0.5",), "clipping"),
    # the default on CPUs allreduces after backward; these take Horovod's DistributedOptimizer path
    (("grad_allreduce=overlap",), "overlapped"),
    (("grad_allreduce=overlap", "grad_accum_steps=2"), "overlapped accumulation"),
])
def test_two_ranks_with_batch_b_match_one_rank_with_batch_2b(tmp_path, settings, name):
    # 37 samples: the last optimizer step of each epoch is uneven across ranks (and empty for some).
    common = ("epochs=3", "extra.n_train=37", "lr=0.05", "base_batch_size=8", *settings)
    two = train(tmp_path, *common, "batch_size=4", name="two")
    one = train(tmp_path, *common, "batch_size=8", np=1, name="one")

    assert two[0]["steps_per_epoch"] == one[0]["steps_per_epoch"]
    for p2, p1 in zip(two[0]["params"], one[0]["params"], strict=True):
        np.testing.assert_allclose(p2, p1, rtol=0, atol=1e-10)
    final_loss = [run[0]["history"][-1]["train_loss"] for run in (two, one)]
    assert final_loss[0] == pytest.approx(final_loss[1], abs=1e-10)


@pytest.mark.parametrize("settings", [("compression=fp16", "gradient_predivide_factor=2.0"),
                                      ("reduce_op=sum",)], ids=["fp16 predivided", "sum"])
def test_gradients_allreduced_after_backward_equal_horovods_overlapped_allreduce(tmp_path, settings):
    # the same op, compression and predivide split as Horovod's DistributedOptimizer, on the same sums
    common = ("epochs=2", "extra.n_train=37", "batch_size=4", "lr=0.05", *settings)
    after = train(tmp_path, *common, "grad_allreduce=after_backward", name="after")
    overlapped = train(tmp_path, *common, "grad_allreduce=overlap", name="overlapped")

    assert after[0]["params_sha256"] == after[1]["params_sha256"]
    for a, o in zip(after[0]["params"], overlapped[0]["params"], strict=True):
        np.testing.assert_allclose(a, o, rtol=0, atol=1e-12)


def test_every_sample_is_used_exactly_once_per_epoch_and_the_order_changes_between_epochs(tmp_path):
    reports = train(tmp_path, "epochs=3", "batch_size=3", "extra.n_train=37", "grad_accum_steps=2")

    for epoch in ("0", "1", "2"):
        used = reports[0]["seen"][epoch] + reports[1]["seen"][epoch]
        assert sorted(used) == list(range(37)), f"epoch {epoch}"
    assert reports[0]["seen"]["0"] != reports[0]["seen"]["1"]


def test_same_seed_gives_the_same_order_and_another_seed_another(tmp_path):
    first = train(tmp_path, "batch_size=4", "seed=7", name="first")
    again = train(tmp_path, "batch_size=4", "seed=7", name="again")
    other = train(tmp_path, "batch_size=4", "seed=8", name="other")

    assert first[0]["seen"] == again[0]["seen"] and first[1]["seen"] == again[1]["seen"]
    assert first[0]["seen"] != other[0]["seen"]


def test_evaluation_on_an_odd_sized_set_equals_the_single_process_result(tmp_path):
    # 9 eval samples over 2 ranks (5 + 4), batch 2: uneven batches and ranks; eval "index" is the mean of
    # the sample indices, which is exactly 4.0 only if each sample counts once with the right weight.
    two = train(tmp_path, "batch_size=2", "extra.n_eval=9", name="two")
    one = train(tmp_path, "batch_size=2", "base_batch_size=2", "lr_scaling=none", "extra.n_eval=9", np=1,
                name="one")

    assert two[0]["history"][-1]["eval_index"] == 4.0
    assert one[0]["history"][-1]["eval_index"] == 4.0
    assert two[0]["history"][-1]["eval_mse"] == two[1]["history"][-1]["eval_mse"]


def test_a_rank_without_evaluation_samples_does_not_hang(tmp_path):
    reports = train(tmp_path, "batch_size=2", "extra.n_eval=1")

    assert reports[0]["history"][-1]["eval_index"] == 0.0
    assert reports[1]["history"][-1]["eval_index"] == 0.0


def _expected_lr(step, lr, peak, warmup):
    return lr + (peak - lr) * step / warmup if step < warmup else peak


@pytest.mark.parametrize(("np_", "accum"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_lr_follows_warmup_to_the_linearly_scaled_lr_counted_in_optimizer_steps(tmp_path, np_, accum):
    lr, batch, warmup = 0.01, 4, 4
    reports = train(tmp_path, f"lr={lr}", f"batch_size={batch}", f"grad_accum_steps={accum}",
                    f"warmup_steps={warmup}", "epochs=2", "extra.n_train=40", np=np_)

    peak = lr * np_ * accum  # linear scaling: global batch / base batch (= batch_size)
    lrs = reports[0]["lrs"]
    assert len(lrs) == 2 * math.ceil(40 / (batch * np_ * accum))  # one LR per optimizer step
    for step, used in enumerate(lrs):
        assert used == pytest.approx(_expected_lr(step, lr, peak, warmup), rel=1e-12), step


def test_a_stop_requested_on_one_rank_stops_all_ranks_at_the_same_step(tmp_path):
    reports = train(tmp_path, "epochs=5", "batch_size=2", "extra.n_train=40", "extra.stop_rank=1",
                    "extra.stop_step=3")

    # asked in on_step_end of step 3, after that step's sync: agreed at the next sync, step 4, by all
    assert [len(r["lrs"]) for r in reports.values()] == [4, 4]
    assert reports[0]["params_sha256"] == reports[1]["params_sha256"]
    assert reports[0]["stop_reason"] == "stop requested by another rank"
    assert reports[1]["stop_reason"] == "rank 1 asked at step 3"


def test_early_stopping_stops_every_rank_together(tmp_path):
    # an LR so large that eval_mse grows: patience 1 stops after the second evaluation
    reports = train(tmp_path, "epochs=10", "batch_size=4", "lr=2.0", "lr_scaling=none", "extra.n_eval=8",
                    "early_stopping_patience=1", "monitor=eval_mse")

    assert len(reports[0]["history"]) == len(reports[1]["history"]) == 2
    assert reports[0]["stop_reason"].startswith("early stopping: eval_mse did not improve")


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_a_bad_config_value_fails_fast_on_every_rank_naming_the_field(tmp_path, controller):
    job = run_job(JOB, "--set", "batch_size=0", out_dir=tmp_path, controller=controller, timeout=60)

    assert job.returncode == 2, job.output
    for rank in (0, 1):
        message = "hvdazure: error: config field 'batch_size': 0 must be at least 1"
        assert f"[{rank}]<stderr>:{message}" in job.stderr


def test_digits_sample_reaches_95_percent_on_two_ranks(tmp_path):
    job = run_job(REPO / "samples" / "torch_digits.py", out_dir=tmp_path, timeout=180)

    assert job.returncode == 0, job.output
    final = [line for line in job.stdout.splitlines() if "final: eval accuracy" in line]
    assert len(final) == 1, job.stdout  # printed by rank 0 only
    accuracy = float(final[0].split("eval accuracy ")[1].split(",")[0])
    assert accuracy >= 0.95


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun", "python"])
def test_the_same_script_runs_under_plain_mpirun_horovodrun_and_python(tmp_path, launcher):
    script = [sys.executable, str(WORKERS / JOB), "--set", "batch_size=4", "--set", "extra.n_train=21"]
    prefix = {
        "mpirun": ["mpirun", "--allow-run-as-root", "-np", "2", "-bind-to", "none", "-map-by", "slot"],
        "horovodrun": [str(Path(sys.executable).parent / "horovodrun"), "-np", "2", "-H", "localhost:2"],
        "python": [],
    }[launcher]
    out = tmp_path / launcher
    out.mkdir()
    proc = subprocess.run([*prefix, *script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HVDAZURE_TEST_OUT": str(out)})
    assert proc.returncode == 0, proc.stdout + proc.stderr

    reports = read_reports(out)
    expected_size = 1 if launcher == "python" else 2
    assert sorted(reports) == list(range(expected_size))
    reference = train(tmp_path, "batch_size=4", "extra.n_train=21", np=expected_size, name="reference")
    assert {r["params_sha256"] for r in reports.values()} == {reference[0]["params_sha256"]}
