"""What `compression: fp16` and `precision: bf16`/`fp16` do to the numbers on real ranks, not only that they
run: fp16's loss scaling on the CPU (a GradScaler on the rank's device) against one process, an overflow on
one rank skipped by every rank alike in each way the gradients are exchanged, and the scale in checkpoints."""

import json

import numpy as np
import pytest
from harness import run_job, run_trainings, set_args

JOB = "precision_job.py"
KNOWN_BF16 = 0.10009765625  # the worker's metric "known" on every batch: 0.1 rounded to bfloat16
NOISE_FLOOR = 0.1**2  # the mean squared error of the true model on the worker's data (noise of std 0.1)
# 1024 samples in 8 optimizer steps of 8 micro-batches of 8 per rank, 2 epochs, metrics reduced only at the
# end of an epoch: each rank adds 64 batches of every metric before a reduction.
TRAINING = ("extra.dtype=float32", "extra.n_train=1024", "batch_size=8", "grad_accum_steps=8", "epochs=2",
            "lr=0.3", "lr_scaling=none", "log_every=1000")


def train(out, *settings):
    out.mkdir()
    job = run_job(JOB, *[arg for s in settings for arg in ("--set", s)], out_dir=out)
    assert job.returncode == 0, job.output
    assert sorted(job.reports) == [0, 1], job.output
    return job.reports


OVERFLOW_STEP = 3  # rank 1's float16 gradients overflow in this step (the worker's extra.overflow_step)
# (on this data fp16's first step overflows on its own at GradScaler's initial scale, 65536, on 2 ranks and on
# 1 process alike: it is skipped and the scale halved before the forced overflow)
OVERFLOW = (*TRAINING, "epochs=1", "precision=fp16", "extra.overflow_rank=1",
            f"extra.overflow_step={OVERFLOW_STEP}")
# How each overflow run exchanges its gradients (grad_allreduce, compression)
EXCHANGES = {"overflow_overlap": ("grad_allreduce=overlap",),
             "overflow_after_backward": ("grad_allreduce=after_backward",),
             "overflow_overlap_fp16": ("grad_allreduce=overlap", "compression=fp16"),
             "overflow_after_backward_fp16": ("grad_allreduce=after_backward", "compression=fp16"),
             # sharded: the overflow lands in every rank's slice through the exchange, and the slices' probe
             # (one scalar allreduce) tells every rank's scaler, which skip alike
             "overflow_zero_stage_1": ("zero_stage=1",),
             "overflow_zero_stage_2": ("zero_stage=2", "zero_bucket_mb=0.000001")}
TIMEOUT = 400  # generous: six trainings in one job on a shared machine (about 30 s idle)


def flat(lists):
    return np.concatenate([np.asarray(values, dtype=np.float64) for values in lists])


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    return train(tmp_path_factory.mktemp("precision") / "fp32", *TRAINING, "precision=fp32")


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    return train(tmp_path_factory.mktemp("precision") / "bf16", *TRAINING, "precision=bf16")


@pytest.fixture(scope="module")
def fp16(tmp_path_factory):
    """One job of fp16 trainings on 2 ranks: plain; an overflow on rank 1 in each way of exchanging the
    gradients (sharded, zero_stage 1 and 2, among them); one with a checkpoint after the overflow, and a run
    resumed from that checkpoint; and bf16 sharded (zero_stage 2)."""
    out = tmp_path_factory.mktemp("fp16")
    runs = {"fp16": (*TRAINING, "precision=fp16"),
            **{name: (*OVERFLOW, *exchange) for name, exchange in EXCHANGES.items()},
            "checkpointed": (*OVERFLOW, "checkpoint_every_steps=4", f"checkpoint_dir={out / 'ckpt'}"),
            "resumed": (*OVERFLOW, f"resume={out / 'ckpt' / 'step-00000004'}",
                        f"checkpoint_dir={out / 'resumed_ckpt'}"),
            "bf16_zero_stage_2": (*TRAINING, "precision=bf16", "zero_stage=2")}
    return run_trainings(runs, out / "runs", script=JOB, timeout=TIMEOUT), out / "ckpt"


@pytest.fixture(scope="module")
def fp16_one_process(tmp_path_factory):
    """fp16 on 1 process with the 2 ranks' global batch, then fp16 with Adasum, which is refused; under MPI,
    where Horovod has Adasum."""
    out = tmp_path_factory.mktemp("fp16_one")
    runs = {"fp16": (*TRAINING, "batch_size=16", "precision=fp16"),
            "adasum": (*TRAINING, "precision=fp16", "reduce_op=adasum")}
    for name in runs:
        (out / name).mkdir()
    (out / "runs.json").write_text(json.dumps({name: list(settings) for name, settings in runs.items()}))
    job = run_job(JOB, "--runs", str(out / "runs.json"), out_dir=out, np=1, controller="mpi", timeout=TIMEOUT)
    return job, json.loads((out / "fp16" / "rank-0.json").read_text())


def test_fp16_compression_exchanges_gradients_rounded_to_float16(tmp_path):
    # float64 model at zero, SGD with lr 1, one step of 4 samples per rank: the parameters after it are
    # exactly minus the averaged gradient Horovod exchanged.
    reports = train(tmp_path / "run", "compression=fp16", "extra.dtype=float64", "extra.zero_init=true",
                    "extra.n_train=8", "batch_size=4", "lr=1", "lr_scaling=none", "max_steps=1")
    exchanged = -flat(reports[0]["params"])
    local = [flat(reports[rank]["first_gradient"]) for rank in (0, 1)]
    exact = (local[0] + local[1]) / 2

    # Each rank's gradient is cast to float16, summed and halved in float16, then cast back. Rounding each
    # rank's gradient before the sum is why this can be a float16 step away from float16(exact).
    through_fp16 = (local[0].astype(np.float16) + local[1].astype(np.float16)) / np.float16(2)
    assert exchanged.tolist() == through_fp16.astype(np.float64).tolist()
    assert np.all(exchanged != exact)


def test_bf16_runs_the_forward_pass_under_autocast_in_bfloat16(fp32, bf16):
    assert [bf16[rank]["forward_dtype"] for rank in (0, 1)] == ["torch.bfloat16"] * 2
    assert [fp32[rank]["forward_dtype"] for rank in (0, 1)] == ["torch.float32"] * 2


def test_bf16_training_differs_from_fp32_by_bfloat16_rounding_and_still_converges(fp32, bf16):
    p32, p16 = flat(fp32[0]["params"]), flat(bf16[0]["params"])
    scale = np.abs(p32).max()
    difference = np.abs(p16 - p32).max() / scale
    # far above float32's rounding (2**-24), within bfloat16's (2**-8)
    assert 2**-16 < difference < 2**-8, difference

    loss32, loss16 = fp32[0]["history"][-1]["train_loss"], bf16[0]["history"][-1]["train_loss"]
    assert loss16 != loss32
    assert loss16 == pytest.approx(loss32, rel=0.05)
    assert loss16 < 2 * NOISE_FLOOR


def test_a_bf16_metric_averaged_over_many_batches_keeps_float64_accuracy(bf16):
    # summed in bfloat16, these 64 batches of 8 samples per rank and epoch would come out 4% low
    for record in bf16[0]["history"]:
        assert record["train_known"] == pytest.approx(KNOWN_BF16, rel=1e-6), record


def test_fp16_trains_on_cpu_ranks_under_float16_autocast_with_a_loss_scaler(fp16, fp32):
    # was: refused on the CPU ("'fp16' needs CUDA (GradScaler)")
    two = fp16[0]["fp16"]
    assert [two[rank]["forward_dtype"] for rank in (0, 1)] == ["torch.float16"] * 2
    assert two[0]["params"] == two[1]["params"]
    assert two[0]["scale_before"][0] == 65536  # GradScaler's initial scale
    assert two[0]["scale_after"] == two[1]["scale_after"]
    p32, p16 = flat(fp32[0]["params"]), flat(two[0]["params"])
    assert 2**-20 < np.abs(p16 - p32).max() / np.abs(p32).max() < 2**-8  # float16's rounding, not float32's
    assert two[0]["history"][-1]["train_loss"] < 2 * NOISE_FLOOR


def test_fp16_on_2_ranks_trains_what_1_process_trains_with_their_global_batch(fp16, fp16_one_process):
    _, one = fp16_one_process
    two = fp16[0]["fp16"][0]
    assert one["scale_after"] == two["scale_after"]  # the same steps skipped, the same scales
    p1, p2 = flat(one["params"]), flat(two["params"])
    assert np.abs(p1 - p2).max() / np.abs(p1).max() < 2**-12  # float16 sums of 16 samples against 2 x 8
    assert one["history"][-1]["train_loss"] == pytest.approx(two["history"][-1]["train_loss"], rel=2**-12)


@pytest.mark.parametrize("run", [*EXCHANGES, "checkpointed"])
def test_an_overflow_on_one_rank_skips_that_step_on_every_rank_and_halves_every_ranks_scale(fp16, run):
    ranks = fp16[0][run]
    assert ranks[0]["scale_before"] == ranks[1]["scale_before"]
    assert ranks[0]["scale_after"] == ranks[1]["scale_after"]
    assert ranks[0]["step_params"] == ranks[1]["step_params"]
    at = OVERFLOW_STEP - 1  # index of the step
    for report in ranks.values():
        before, after, params = report["scale_before"], report["scale_after"], report["step_params"]
        assert after[at] == before[at] / 2, (run, before, after)
        assert params[at] == params[at - 1]  # not applied, on rank 0 too, whose own gradients were finite
        assert params[at + 1] != params[at]  # and training goes on
    unforced = fp16[0]["fp16"][0]
    assert unforced["scale_after"][at] == unforced["scale_before"][at]  # without the overflow: no skip there
    assert unforced["step_params"][at] != unforced["step_params"][at - 1]
    assert np.isfinite(flat(ranks[0]["params"])).all()


def test_bf16_with_sharded_optimizer_and_gradients_trains_what_bf16_trains_unsharded(fp16, bf16):
    sharded = fp16[0]["bf16_zero_stage_2"]
    assert sharded[0]["forward_dtype"] == "torch.bfloat16"
    assert sharded[0]["params"] == sharded[1]["params"]
    np.testing.assert_allclose(flat(sharded[0]["params"]), flat(bf16[0]["params"]), rtol=1e-6, atol=0)


def test_a_checkpoint_keeps_the_loss_scale_and_a_resume_goes_on_with_it(fp16):
    runs, directory = fp16
    saved = json.loads((directory / "step-00000004" / "trainer_state.json").read_text())["framework"]
    checkpointed, resumed = runs["checkpointed"], runs["resumed"]
    assert saved["grad_scaler"]["scale"] == checkpointed[0]["scale_after"][3] <= 65536 / 2
    saved = saved["grad_scaler"]
    assert [resumed[rank]["scale_before"][0] for rank in (0, 1)] == [saved["scale"]] * 2
    assert resumed[0]["params"] == resumed[1]["params"] == checkpointed[0]["params"]  # bit-identical


def test_fp16_with_adasum_is_refused_with_one_line(fp16_one_process):
    job, _ = fp16_one_process
    assert job.returncode == 2, job.output
    assert ("config field 'precision': 'fp16' cannot be used with reduce_op 'adasum' (Horovod's Adasum "
            "optimizer steps each parameter during backward") in job.stderr, job.output
    assert "Traceback" not in job.output


def test_on_nan_loss_skip_with_adasum_is_refused_with_one_line(tmp_path):
    # was: the rank whose gradients were not finite skipped Horovod's Adasum step and broke its optimizer
    # (an AssertionError from zero_grad, every rank stopped), after sending the other ranks its NaN update
    settings = ["on_nan_loss=skip", "reduce_op=adasum", "batch_size=4"]
    job = run_job(JOB, *set_args(settings), out_dir=tmp_path, np=1, controller="mpi", timeout=TIMEOUT)
    assert job.returncode == 2, job.output
    assert ("config field 'on_nan_loss': 'skip' cannot be used with reduce_op 'adasum' (Horovod's Adasum "
            "optimizer steps each parameter during backward, before a step whose gradients are not finite "
            "can be skipped); use 'stop', or reduce_op 'average'") in job.stderr, job.output
    assert "Traceback" not in job.output
