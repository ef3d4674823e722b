"""TensorFlowTrainer with `precision: fp16` on real ranks, on CPU (Keras's mixed_float16 policy and
LossScaleOptimizer run there): the gradients are allreduced while still scaled, so an overflow on one rank
reaches every rank through the allreduce (also rounded to float16 by `compression: fp16`), and every rank
skips the same step and halves its scale identically; clipping clips the unscaled gradients; checkpoints
hold the loss scale and a resume goes on from it. The TensorFlow side of test_torch_precision.py.

Two jobs (TensorFlow takes seconds to start on every rank): 2 ranks under Gloo and 1 process, each running
its trainings in turn (harness.run_trainings).
"""

import numpy as np
import pytest
from harness import run_trainings

JOB = "tf_job.py"
# 37 samples, global batches of 8: 5 steps an epoch, 10 in all. A loss scale of 1024 leaves this model's
# float16 gradients finite; at step 4 one rank's gradients are multiplied by 1e6 and overflow float16.
# Checkpoints every 5 steps: step 5's, the first after the overflow, is the one resumed.
COMMON = ("epochs=2", "lr=0.025", "base_batch_size=4", "extra.n_train=37", "checkpoint_every_epochs=null")
BATCH = {2: "batch_size=4", 1: "batch_size=8"}
FP16 = ("precision=fp16", "extra.loss_scale=1024", "extra.overflow_step=4")
SCALES = [1024.0] * 3 + [512.0] * 7  # after each of the 10 steps: step 4 skipped, the scale halved
CLIP = "grad_clip_norm=0.1"  # below this model's gradient norms: every step is clipped


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs(np): the trainings of the job of np ranks, by name (each rank's report), and the job."""
    two = tmp_path_factory.mktemp("tf-fp16-2")
    checkpoints = two / "ckpt"
    trainings = {2: {
        "fp16": (*FP16, "extra.overflow_rank=1", f"checkpoint_dir={checkpoints}", "checkpoint_every_steps=5"),
        "fp16_compressed": (*FP16, "extra.overflow_rank=1", "compression=fp16"),
        "fp16_resumed": (*FP16, f"resume={checkpoints / 'step-00000005'}"),
        # clipping with and without loss scaling (bf16: float32 variables too, the same initial weights)
        "fp16_clipping": ("precision=fp16", "extra.loss_scale=1024", CLIP),
        "bf16_clipping": ("precision=bf16", CLIP),
        # fp32 after fp16 in the same process: Keras's global policy is the user's again (a float64 model)
        "fp32_clipping": (CLIP,),
    }, 1: {
        "fp16": (*FP16, "extra.overflow_rank=0"),
    }}
    jobs = {}

    def get(np):
        if np not in jobs:
            out = two if np == 2 else tmp_path_factory.mktemp("tf-fp16-1")
            settings = {name: (*COMMON, *own, BATCH[np]) for name, own in trainings[np].items()}
            controller = "gloo" if np == 2 else "mpi"
            jobs[np] = run_trainings(settings, out, np=np, controller=controller, script=JOB, timeout=600)
            jobs[np].checkpoints = checkpoints
        return jobs[np]

    return get


@pytest.mark.parametrize("training", ["fp16", "fp16_compressed"])
def test_an_overflow_on_one_rank_skips_the_same_step_on_every_rank_and_halves_every_ranks_scale(
        runs, training):
    # was: precision fp16 refused on CPU ("needs a GPU (loss scaling)"): the path never ran on real ranks
    job = runs(2)
    reports = job[training]

    assert reports[0]["loss_scales"] == reports[1]["loss_scales"] == SCALES
    assert reports[0]["params_sha256"] == reports[1]["params_sha256"]
    assert reports[0]["history"] == reports[1]["history"]
    assert reports[0]["dtypes"] == ["float32"]  # mixed_float16: float32 variables, float16 computation
    losses = [record["train_loss"] for record in reports[0]["history"]]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]  # it trained on after the skipped step
    line = ("fp16 loss scaling skipped 1 step(s) whose scaled gradients overflowed, up to step 4 (1 in this "
            "run so far")
    assert job.job.output.count(line) == 2, job.job.output  # fp16 and fp16_compressed, rank 0 alone


def test_two_ranks_with_fp16_match_one_process_that_skips_the_same_step(runs):
    two, one = runs(2)["fp16"][0], runs(1)["fp16"][0]

    assert one["loss_scales"] == SCALES
    for w2, w1 in zip(two["params"], one["params"], strict=True):
        assert w2 == pytest.approx(w1, rel=0, abs=2e-4)  # float16 forward and backward on other batches


def test_a_checkpoint_holds_the_loss_scale_and_a_resume_goes_on_from_it(runs):
    job = runs(2)
    with np.load(job.checkpoints / "step-00000005" / "optimizer.npz", allow_pickle=False) as stored:
        paths = [str(p) for p in stored["paths"]]
        scale = stored[f"{paths.index('loss_scale_optimizer/dynamic_scale'):05d}"]
    assert scale == 512.0  # halved at step 4
    resumed, uninterrupted = job["fp16_resumed"], job["fp16"]

    assert "hvdazure: resumed from step-00000005" in job.job.output
    assert resumed[0]["loss_scales"] == resumed[1]["loss_scales"] == SCALES[5:]
    assert resumed[0]["params_sha256"] == uninterrupted[0]["params_sha256"]


def test_fp16_clips_the_allreduced_gradients_after_unscaling_them(runs):
    # was: refused ("grad_clip_norm: not supported with precision 'fp16'"), as the scaled gradients were
    # clipped: 1024 times too much. Now it clips as bf16 does (no loss scale), within their rounding
    job = runs(2)
    fp16, bf16 = job["fp16_clipping"], job["bf16_clipping"]

    assert fp16[0]["params_sha256"] == fp16[1]["params_sha256"]
    assert fp16[0]["loss_scales"] == [1024.0] * 10
    for w16, w32 in zip(fp16[0]["params"], bf16[0]["params"], strict=True):
        assert w16 == pytest.approx(w32, rel=0, abs=1e-3)


def test_a_float64_model_after_an_fp16_training_in_the_same_process_is_float64_again(runs):
    # was: the global policy stayed mixed_float16 after fp16's fit(): the next trial of a sweep with fp32
    # built a float32 model computing in float16
    assert runs(2)["fp32_clipping"][0]["dtypes"] == ["float64"]
