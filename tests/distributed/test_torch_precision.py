"""What `compression: fp16` and `precision: bf16` do to the numbers on real ranks, not only that they run."""

import numpy as np
import pytest
from harness import run_job

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


def flat(lists):
    return np.concatenate([np.asarray(values, dtype=np.float64) for values in lists])


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    return train(tmp_path_factory.mktemp("precision") / "fp32", *TRAINING, "precision=fp32")


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    return train(tmp_path_factory.mktemp("precision") / "bf16", *TRAINING, "precision=bf16")


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
