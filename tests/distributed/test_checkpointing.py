"""Checkpoints on real ranks: exact resume after a kill, a crash mid-write, corruption, another world size,
SIGTERM, and retention."""

import json
import os
import shutil
import signal
import time
from functools import partial

import pytest
from harness import (
    WORKERS,
    finish,
    processes_running,
    read_reports,
    run_job,
    run_trainings,
    start_job,
    wait_for,
)
from harness import set_args as _args
from harness import train as train_job
from rank_output import lines_of

from hvdazure.core.checkpoint.store import CheckpointManager

JOB = "torch_job.py"
# 37 samples, batch 4 on 2 ranks: 5 steps per epoch with an uneven last step; checkpoints every 3 steps
BASE = ("epochs=3", "batch_size=4", "extra.n_train=37", "lr=0.05", "checkpoint_every_steps=3",
        "checkpoint_every_epochs=null")
train = partial(train_job, JOB)  # train(tmp_path, name, *settings, np=2, expect=0)
start = partial(start_job, JOB)  # start(tmp_path, name, *settings): (process, report folder)


@pytest.fixture
def uninterrupted(torch_runs):
    """The reference: the same training, never interrupted (with the same checkpoint schedule); one run
    per session, shared with the tests that damage its checkpoints and with tests/storage."""
    return torch_runs.get(*BASE).job.reports[0]


def test_sigkill_of_a_rank_mid_epoch_ends_the_job_and_resume_is_exact(tmp_path, uninterrupted):
    ckpt = tmp_path / "ckpt"
    proc, out = start(tmp_path, "killed", *BASE, f"checkpoint_dir={ckpt}", "extra.step_sleep=0.3")
    wait_for(lambda: (ckpt / "step-00000006").exists(), "the checkpoint of step 6")  # in epoch 2
    os.kill(int((out / "pid-1").read_text()), signal.SIGKILL)
    killed_at = time.monotonic()
    output = finish(proc)

    assert proc.returncode == 128 + signal.SIGKILL, output
    assert "rank 1 failed first, with exit code 137 (killed by SIGKILL)" in output
    assert time.monotonic() - killed_at < 30  # promptly, not after a collective's timeout
    assert not processes_running(str(WORKERS / JOB))

    resumed = train(tmp_path, "resumed", *BASE, f"checkpoint_dir={ckpt}", "resume=auto")
    assert "hvdazure: resumed from step-0000000" in resumed.stderr
    assert resumed.reports[0]["params_sha256"] == uninterrupted["params_sha256"]
    assert resumed.reports[0]["history"] == uninterrupted["history"]


def test_killing_rank0_while_it_writes_a_checkpoint_leaves_latest_valid(tmp_path):
    ckpt = tmp_path / "ckpt"
    # a 64 MB buffer makes each save take long enough to be caught in the middle
    settings = (*BASE, f"checkpoint_dir={ckpt}", "extra.big_mb=64", "checkpoint_every_steps=2")
    proc, out = start(tmp_path, "killed", *settings)
    def writing() -> bool:
        return (ckpt / "latest").exists() and any(p.name.startswith(".tmp-step") for p in ckpt.iterdir())

    wait_for(writing, "a checkpoint being written")
    os.kill(int((out / "pid-0").read_text()), signal.SIGKILL)
    output = finish(proc)
    assert proc.returncode == 128 + signal.SIGKILL, output

    manager = CheckpointManager(str(ckpt))
    named = (ckpt / "latest").read_text().strip()
    latest = next(c for c in manager.checkpoints() if c.name == named)
    manager.verify(latest)  # raises if `latest` named a half-written checkpoint

    resumed = train(tmp_path, "resumed", *settings, "resume=auto")
    assert f"resumed from {named}" in resumed.stderr
    assert not any(p.name.startswith(".tmp-") for p in ckpt.iterdir())  # leftovers cleaned on resume


def test_a_damaged_latest_checkpoint_is_skipped_for_the_previous_one(tmp_path, torch_runs):
    # two copies of the uninterrupted run's checkpoints, the latest truncated in one and a bit flipped in the
    # other; each resumed in turn in one job
    runs = {}
    for damage in ("truncate", "flip_bit"):
        ckpt = torch_runs.get(*BASE).copy_checkpoints(tmp_path / damage)
        latest = (ckpt / "latest").read_text().strip()
        target = ckpt / latest / "model.pt"
        data = bytearray(target.read_bytes())
        if damage == "truncate":
            data = data[: len(data) // 2]
        else:
            data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))
        runs[damage] = (*BASE, f"checkpoint_dir={ckpt}", "resume=auto", "epochs=4")
    previous = sorted(p.name for p in ckpt.glob("step-*") if p.name < latest)[-1]

    resumed = run_trainings(runs, tmp_path / "resumed", script=JOB).job
    warnings = [line for line in resumed.stderr.splitlines() if "skipping invalid" in line]
    assert len(warnings) == 2, resumed.stderr  # one per damaged copy, each naming its latest's model.pt
    assert all(latest in warning and "model.pt" in warning for warning in warnings), warnings
    assert [damage in warning for damage, warning in zip(runs, warnings, strict=True)] == [True, True]
    assert resumed.stderr.count(f"resumed from {previous}") == 2, resumed.stderr


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_resume_with_another_world_size_continues_the_epoch_exactly_once_with_the_lr_rescaled(
        tmp_path, torch_runs, before, after):
    # stops at step 7: mid-epoch (epoch 2 for 2 ranks x batch 4; epoch 1 for 1 rank)
    run = torch_runs.get(*BASE, "max_steps=7", np=before)
    first, ckpt = run.job, run.copy_checkpoints(tmp_path / "ckpt")
    manifest = json.loads((ckpt / "step-00000007" / "manifest.json").read_text())
    second = train(tmp_path, "second", *BASE, f"checkpoint_dir={ckpt}", "resume=auto", np=after)

    assert manifest["samples_in_epoch"] % 37 != 0  # the first run stopped mid-epoch
    for epoch in ("0", "1", "2"):  # the whole run, not only the interrupted epoch: every sample once
        used = [i for run in (first, second) for r in run.reports.values() for i in r["seen"].get(epoch, [])]
        assert sorted(used) == list(range(37)), (epoch, second.output)
    history = second.reports[0]["history"]
    assert [record["epoch"] for record in history] == [0, 1, 2]
    assert history[-1]["samples_seen"] == 3 * 37  # was: a resume on more ranks stopped an epoch early

    old_lr, new_lr = 0.05 * before, 0.05 * after  # linear scaling with the default base batch
    assert (f"world size {before} -> {after}, global batch {4 * before} -> {4 * after}: LR rescaled "
            f"{old_lr:g} -> {new_lr:g}") in second.stderr
    assert second.reports[0]["lrs"] == pytest.approx([new_lr] * len(second.reports[0]["lrs"]))
    final = CheckpointManager(str(ckpt)).latest_valid()[0]
    assert final.manifest["world_size"] == after
    assert final.manifest["world_size_history"] == [{"step": 7, "world_size": after,
                                                     "global_batch_size": 4 * after}]


def test_sigterm_saves_a_final_checkpoint_and_exits_cleanly(tmp_path, uninterrupted):
    ckpt = tmp_path / "ckpt"
    proc, out = start(tmp_path, "stopped", *BASE, f"checkpoint_dir={ckpt}", "extra.step_sleep=0.3")
    wait_for(lambda: (ckpt / "step-00000003").exists(), "training to be under way")
    proc.send_signal(signal.SIGTERM)  # to `hvdazure run`, as a scheduler or Ctrl-C would
    output = finish(proc)

    assert proc.returncode == 128 + signal.SIGTERM, output
    assert "Traceback" not in output
    assert "received SIGTERM: saved checkpoint step-" in output
    final = CheckpointManager(str(ckpt)).latest_valid()[0]
    assert final.manifest["reason"] == "signal: SIGTERM"
    assert not processes_running(str(WORKERS / JOB))
    assert not read_reports(out)  # no rank ran to the end

    resumed = train(tmp_path, "resumed", *BASE, f"checkpoint_dir={ckpt}", "resume=auto")
    assert resumed.reports[0]["params_sha256"] == uninterrupted["params_sha256"]


def test_keep_last_and_keep_best_leave_exactly_the_right_checkpoints(tmp_path):
    ckpt = tmp_path / "ckpt"
    # a large LR: eval_mse first falls, then rises, so the best checkpoint is not among the last
    job = train(tmp_path, "run", "epochs=6", "batch_size=4", "extra.n_train=37", "extra.n_eval=8", "lr=0.35",
                "lr_scaling=none", f"checkpoint_dir={ckpt}", "checkpoint_every_epochs=1", "keep_last=2",
                "keep_best=1", "monitor=eval_mse")
    history = job.reports[0]["history"]
    best = min(history, key=lambda record: record["eval_mse"])
    expected = {f"step-{record['step']:08d}" for record in history[-2:]} | {f"step-{best['step']:08d}"}

    assert {p.name for p in ckpt.iterdir() if p.is_dir()} == expected
    assert best not in history[-2:], "the run did not exercise keep_best; adjust lr"

    from hvdazure.torch import load_weights

    weights = load_weights(str(ckpt), "latest")
    assert [w.flatten().tolist() for w in weights.values()] == job.reports[0]["params"]
    best_weights = load_weights(str(ckpt), "best")
    assert set(best_weights) == {"weight", "bias"}


def test_resuming_from_a_missing_path_fails_on_every_rank_without_hanging(tmp_path):
    job = run_job(JOB, *_args(("batch_size=4", "resume=/no/such/checkpoint")), out_dir=tmp_path, timeout=60)

    assert job.returncode != 0, job.output
    assert "/no/such/checkpoint" in job.stderr
    assert not job.reports


@pytest.mark.parametrize("mode", ["checkpoint_async=true", "checkpoint_async=false"])
def test_a_failing_save_on_rank0_is_an_error_on_every_rank_not_a_hang(tmp_path, mode):
    unwritable = "/proc/hvdazure-cannot-write-here"  # not even root can create a directory in /proc
    job = run_job(JOB, *_args((*BASE, f"checkpoint_dir={unwritable}", mode)), out_dir=tmp_path, timeout=90)

    assert job.returncode != 0, job.output
    message = f"saving a checkpoint to {unwritable} failed"
    for rank in (0, 1):
        lines = lines_of(job.stderr, rank)
        assert any(message in line for line in lines), job.stderr
    assert not job.reports


def test_resume_from_an_explicit_checkpoint_path_without_a_checkpoint_dir(tmp_path, torch_runs):
    ckpt = torch_runs.get(*BASE, "max_steps=7").copy_checkpoints(tmp_path / "ckpt")
    chosen = ckpt / "step-00000006"

    resumed = train(tmp_path, "resumed", *BASE, f"resume={chosen}")

    assert "resumed from step-00000006 at epoch 2, step 6" in resumed.stderr
    assert resumed.reports[0]["lrs"] and len(resumed.reports[0]["lrs"]) == 15 - 6


# --- a resume that fails on rank 0 fails on every rank, with one message ---------------------------------
FEATURES = "extra.features=4"  # the checkpointed model: 4 inputs (the worker's default model has 3)


@pytest.fixture
def trained(torch_runs):
    """Checkpoints of a short run of the 4-feature model (steps 3, 6 and the final 7); copy to damage them."""
    return torch_runs.get(*BASE, FEATURES, "max_steps=7").checkpoint_dir


def _replace_model_by_a_directory(ckpt):
    target = ckpt / "step-00000007" / "model.pt"  # reading it fails with an OSError, not a checksum mismatch
    target.unlink()
    target.mkdir()


def _drop_world_size_from_the_manifest(ckpt):
    manifest = ckpt / "step-00000007" / "manifest.json"  # the manifest is not checksummed: files still verify
    data = json.loads(manifest.read_text())
    del data["world_size"]
    manifest.write_text(json.dumps(data))


# name: (damage, how the run resumes, what the error names besides the checkpoint)
FAILED_RESUMES = {
    "unreadable file": (_replace_model_by_a_directory, (FEATURES, "resume=auto"), ("model.pt", "directory")),
    "manifest without a key": (_drop_world_size_from_the_manifest, (FEATURES, "resume={ckpt}/step-00000007"),
                               ("'world_size'",)),
    "another model's checkpoint": (lambda ckpt: None, ("extra.features=3", "resume=auto"),
                                   ("size mismatch",)),
}


def _errors(stderr):
    """Each rank's one-line errors (`hvdazure: error: ...`), by rank."""
    return {rank: [line.removeprefix("hvdazure: error: ") for line in lines_of(stderr, rank)
                   if line.startswith("hvdazure: error: ")] for rank in (0, 1)}


@pytest.mark.parametrize("case", FAILED_RESUMES)
def test_a_resume_failing_on_rank0_is_the_same_one_line_error_on_every_rank(tmp_path, trained, case):
    damage, settings, problem = FAILED_RESUMES[case]
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained, ckpt)
    damage(ckpt)
    settings = [s.format(ckpt=ckpt) for s in (*BASE, f"checkpoint_dir={ckpt}", *settings)]

    job = run_job(JOB, *_args(settings), out_dir=tmp_path, timeout=180)  # a hang fails here

    assert job.returncode != 0, job.output
    errors = _errors(job.stderr)
    assert len(errors[0]) == 1 and errors[1] == errors[0], job.stderr
    assert all(part in errors[0][0] for part in ("step-00000007", *problem)), errors[0][0]
    assert "Horovod has been shut down" not in job.output and "HorovodInternalError" not in job.output
    assert "Traceback" not in job.stderr, job.stderr
    assert not job.reports


def test_a_resume_error_caught_by_the_users_code_is_raised_on_every_rank(tmp_path, trained):
    # rank 0 lives on after the error (a notebook, a retry loop): the other ranks must not wait for it
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained, ckpt)
    settings = (*BASE, f"checkpoint_dir={ckpt}", "extra.features=3", "resume=auto",
                "extra.catch_checkpoint_errors=true")

    job = run_job(JOB, *_args(settings), out_dir=tmp_path, timeout=180)

    assert job.returncode == 0, job.output
    assert set(job.reports) == {0, 1}, job.output
    messages = {report["checkpoint_error"] for report in job.reports.values()}
    assert len(messages) == 1 and "size mismatch" in messages.pop(), job.reports


def test_resume_from_the_latest_pointer_file_resumes_the_checkpoint_it_names(tmp_path, trained):
    resumed = train(tmp_path, "resumed", *BASE, FEATURES, f"resume={trained / 'latest'}")

    assert "resumed from step-00000007 at epoch 2, step 7" in resumed.stderr


def test_a_fresh_run_into_another_run_s_directory_is_one_line_on_every_rank_and_exit_2(tmp_path, trained):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained, ckpt)
    before = sorted((p.relative_to(ckpt), p.stat().st_mtime_ns) for p in ckpt.rglob("*"))

    job = train(tmp_path, "fresh", *BASE, FEATURES, f"checkpoint_dir={ckpt}", "epochs=1", expect=2)

    errors = _errors(job.stderr)
    assert len(errors[0]) == 1 and errors[1] == errors[0], job.stderr
    assert errors[0][0].startswith(f"config field 'checkpoint_dir': {ckpt} holds the checkpoints of another "
                                   "run (run "), errors[0][0]
    assert errors[0][0].endswith("newest step-00000007); continue that run with resume=auto, or give this "
                                 "run a new checkpoint_dir"), errors[0][0]
    assert "Traceback" not in job.stderr, job.stderr
    assert not list((tmp_path / "fresh").glob("pid-*"))  # no rank got to its first step
    assert sorted((p.relative_to(ckpt), p.stat().st_mtime_ns) for p in ckpt.rglob("*")) == before
