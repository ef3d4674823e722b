"""A run resumed on another number of ranks ends where the uninterrupted run would: after `epochs` full
epochs (every sample of every epoch exactly once) or after `max_steps` optimizer steps in all."""

import json

import pytest
from harness import run_job, run_trainings

JOB = "torch_job.py"
BASE = ("epochs=3", "batch_size=4", "extra.n_train=37", "lr=0.05", "checkpoint_every_steps=3",
        "checkpoint_every_epochs=null")


def _train(tmp_path, name, *settings, np):
    out = tmp_path / name
    out.mkdir()
    job = run_job(JOB, *[a for s in settings for a in ("--set", s)], out_dir=out, np=np, timeout=180)
    assert job.returncode == 0, job.output
    return job


def _seen(runs, epoch):
    """The samples of `epoch` that `runs` (each rank -> report) trained on, all ranks together."""
    return sorted(i for reports in runs for report in reports.values()
                  for i in report["seen"].get(str(epoch), []))


@pytest.mark.parametrize(("before", "after"), [(1, 2), (1, 3), (3, 1)])
def test_a_run_resumed_on_another_number_of_ranks_trains_every_epoch_to_the_end(tmp_path, torch_runs, before,
                                                                              after):
    # was: 1 -> 2 ranks stopped after 90 of the 111 sample-epochs, exiting 0 (step counter vs a step total
    # computed for the new world size)
    run = torch_runs.get(*BASE, "max_steps=8", np=before)  # 1 -> 2 and 1 -> 3 start from the same run
    first, ckpt = run.job, run.copy_checkpoints(tmp_path / "ckpt")
    # the resume, then the same resume of the finished run, one after the other in one job
    resume = (*BASE, f"checkpoint_dir={ckpt}", "resume=auto")
    trainings = run_trainings({"second": resume, "again": resume}, tmp_path / "jobs", np=after, timeout=180)
    second, again = trainings["second"], trainings["again"]

    for epoch in range(3):
        assert _seen([first.reports, second], epoch) == list(range(37)), (epoch, trainings.job.output)
    history = second[0]["history"]
    assert [record["epoch"] for record in history] == [0, 1, 2]
    assert history[-1]["samples_seen"] == 3 * 37

    assert again[0]["history"] == history  # finished: nothing left to train
    assert _seen([again], 0) == _seen([again], 2) == []


def test_max_steps_counts_the_optimizer_steps_taken_across_a_resume_on_more_ranks(tmp_path, torch_runs):
    ckpt = torch_runs.get(*BASE, "max_steps=7", np=1).copy_checkpoints(tmp_path / "ckpt")
    second = _train(tmp_path, "second", *BASE, f"checkpoint_dir={ckpt}", "resume=auto", "max_steps=12", np=2)

    assert second.reports[0]["history"][-1]["step"] == 12
    assert len(second.reports[0]["lrs"]) == 5  # steps 8..12, on 2 ranks
    manifest = json.loads((ckpt / "step-00000012" / "manifest.json").read_text())
    assert manifest["step"] == 12
