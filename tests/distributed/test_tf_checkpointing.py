"""TensorFlowTrainer checkpoints on real ranks: exact resume after a SIGKILL and after SIGTERM, resume on
another number of ranks, a checkpoint of another model, and the weights for inference (the TensorFlow side
of test_checkpointing.py and test_resume_across_world_sizes.py)."""

import json
import os
import shutil
import signal
from functools import partial

import numpy as np
import pytest
from harness import WORKERS, finish, processes_running, read_reports, run_job, start_job, wait_for
from harness import set_args as _args
from harness import train as train_job
from rank_output import lines_of

from hvdazure.core.checkpoint.store import CheckpointManager

JOB = "tf_job.py"
# 37 samples, batch 4 on 2 ranks: 5 steps per epoch with an uneven last step; checkpoints every 3 steps;
# 9 eval samples, so that checkpoints after the first evaluation have an eval_mse to be the best by
BASE = ("epochs=3", "batch_size=4", "extra.n_train=37", "extra.n_eval=9", "lr=0.05", "monitor=eval_mse",
        "checkpoint_every_steps=3", "checkpoint_every_epochs=null")
train = partial(train_job, JOB)  # train(tmp_path, name, *settings, np=2, controller="gloo", expect=0)
start = partial(start_job, JOB)  # start(tmp_path, name, *settings, controller="gloo")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference: the same training, never interrupted (with the same checkpoint schedule), and its
    checkpoints."""
    tmp = tmp_path_factory.mktemp("reference")
    job = train(tmp, "run", *BASE, f"checkpoint_dir={tmp / 'ckpt'}", "extra.load_weights=true")
    return job.reports[0], tmp / "ckpt"


def test_sigkill_of_a_rank_mid_epoch_ends_the_job_and_resume_is_exact(tmp_path, uninterrupted):
    reference, _ = uninterrupted
    ckpt = tmp_path / "ckpt"
    proc, out = start(tmp_path, "killed", *BASE, f"checkpoint_dir={ckpt}", "extra.step_sleep=0.3")
    wait_for(lambda: (ckpt / "step-00000006").exists(), "the checkpoint of step 6", proc)  # in epoch 2
    os.kill(int((out / "pid-1").read_text()), signal.SIGKILL)
    output = finish(proc)

    assert proc.returncode == 128 + signal.SIGKILL, output
    assert "rank 1 failed first, with exit code 137 (killed by SIGKILL)" in output
    assert not processes_running(str(WORKERS / JOB))

    resumed = train(tmp_path, "resumed", *BASE, f"checkpoint_dir={ckpt}", "resume=auto")
    assert "hvdazure: resumed from step-0000000" in resumed.stderr
    assert resumed.reports[0]["params_sha256"] == reference["params_sha256"]
    assert resumed.reports[0]["history"] == reference["history"]
    assert resumed.reports[0]["traces"]["training_step"] == 1


def test_sigterm_to_hvdazure_run_saves_a_final_checkpoint_and_resume_is_exact(tmp_path, uninterrupted):
    reference, _ = uninterrupted
    ckpt = tmp_path / "ckpt"
    proc, out = start(tmp_path, "stopped", *BASE, f"checkpoint_dir={ckpt}", "extra.step_sleep=0.3",
                      controller="mpi")
    wait_for(lambda: (ckpt / "step-00000003").exists(), "training to be under way", proc)
    proc.send_signal(signal.SIGTERM)  # to `hvdazure run`, as a scheduler or Ctrl-C would
    output = finish(proc)

    assert proc.returncode == 128 + signal.SIGTERM, output
    assert "Traceback" not in output
    assert "received SIGTERM: saved checkpoint step-" in output
    final = CheckpointManager(str(ckpt)).latest_valid()[0]
    assert final.manifest["reason"] == "signal: SIGTERM"
    assert not processes_running(str(WORKERS / JOB))
    assert not read_reports(out)  # no rank ran to the end

    resumed = train(tmp_path, "resumed", *BASE, f"checkpoint_dir={ckpt}", "resume=auto", controller="mpi")
    assert f"resumed from {final.name}" in resumed.stderr
    assert resumed.reports[0]["params_sha256"] == reference["params_sha256"]
    assert resumed.reports[0]["history"] == reference["history"]


def _seen(jobs, epoch):
    return sorted(i for job in jobs for report in job.reports.values()
                  for i in report["seen"].get(str(epoch), []))


def test_a_run_resumed_from_2_to_1_and_from_1_to_2_ranks_trains_every_sample_of_every_epoch_once(tmp_path):
    ckpt = tmp_path / "ckpt"
    settings = (*BASE, f"checkpoint_dir={ckpt}")
    # 2 ranks stop at step 7 (epoch 2, 16 samples in); 1 rank goes on to step 16 (epoch 3, 12 samples in)
    first = train(tmp_path, "first", *settings, "max_steps=7", np=2)
    second = train(tmp_path, "second", *settings, "resume=auto", "max_steps=16", np=1)
    third = train(tmp_path, "third", *settings, "resume=auto", np=2)

    for epoch in range(3):
        assert _seen([first, second, third], epoch) == list(range(37)), (epoch, third.output)
    assert "world size 2 -> 1, global batch 8 -> 4: LR rescaled 0.1 -> 0.05" in second.stderr
    assert "world size 1 -> 2, global batch 4 -> 8: LR rescaled 0.05 -> 0.1" in third.stderr
    assert second.reports[0]["lrs"] == [0.05] * 9
    assert third.reports[0]["lrs"] == [0.1] * 4  # 25 samples left in the last epoch
    history = third.reports[0]["history"]
    assert [record["epoch"] for record in history] == [0, 1, 2]
    assert history[-1]["samples_seen"] == 3 * 37
    assert third.reports[0]["params_sha256"] == third.reports[1]["params_sha256"]
    final = CheckpointManager(str(ckpt)).latest_valid()[0]
    assert final.manifest["world_size_history"] == [{"step": 7, "world_size": 1, "global_batch_size": 4},
                                                    {"step": 16, "world_size": 2, "global_batch_size": 8}]


def _errors(stderr):
    """Each rank's one-line errors (`hvdazure: error: ...`), by rank."""
    return {rank: [line.removeprefix("hvdazure: error: ") for line in lines_of(stderr, rank)
                   if line.startswith("hvdazure: error: ")] for rank in (0, 1)}


def test_a_checkpoint_of_another_model_shape_is_one_line_error_on_every_rank(tmp_path, uninterrupted):
    _, trained = uninterrupted  # a model of 3 features; this run builds one of 4
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained, ckpt)

    job = run_job(JOB, *_args((*BASE, f"checkpoint_dir={ckpt}", "resume=auto", "extra.features=4")),
                  out_dir=tmp_path, timeout=240)  # a hang fails here

    assert job.returncode != 0, job.output
    errors = _errors(job.stderr)
    assert len(errors[0]) == 1 and errors[1] == errors[0], job.stderr
    assert all(part in errors[0][0] for part in ("step-00000015", "shape (3, 1)", "(4, 1)")), errors[0][0]
    assert "Traceback" not in job.stderr, job.stderr
    assert not job.reports


def test_load_weights_gives_the_latest_and_the_best_checkpoints_weights_to_set_weights(uninterrupted):
    reference, ckpt = uninterrupted
    # the job set them into a new model: load_weights(checkpoint_dir, "latest" | "best")
    loaded = reference["loaded"]

    assert loaded["latest"] == reference["params"]
    eval_mse = {p.parent.name: json.loads(p.read_text())["metrics"].get("eval_mse", float("inf"))
                for p in ckpt.glob("step-*/manifest.json")}
    best = min(sorted(eval_mse, reverse=True), key=eval_mse.get)  # on a tie, the newer checkpoint
    with np.load(ckpt / best / "model.npz") as stored:
        assert loaded["best"] == [stored[f"{i:05d}"].flatten().tolist() for i in range(2)]
    assert loaded["best"] != loaded["latest"], "the run did not exercise 'best'; adjust lr"
