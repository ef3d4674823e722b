"""The short last step of an epoch and metrics that differ between ranks: no forward pass on nothing, no
hang, no mixing, and a clear error where a model cannot train on what the plan gives it (or the plan has
no full step to give)."""

import pytest
from harness import CONTROLLERS, run_job
from rank_output import lines_of

from hvdazure.core.sample_plan import SamplePlan

JOB = "torch_job.py"
NO_HANG = 90


def _args(*settings):
    return [a for s in settings for a in ("--set", s)]


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_ranks_reporting_different_metrics_neither_hang_nor_mix_them(tmp_path, controller):
    # was: rank 0 returned {"loss", "extra"}, rank 1 {"loss"}: the two waited on differently named
    # collectives until the job was killed
    job = run_job(JOB, *_args("epochs=2", "batch_size=4", "extra.n_train=16", "extra.extra_metric_rank=0"),
                  out_dir=tmp_path, controller=controller, timeout=NO_HANG)

    assert job.returncode == 0, job.output
    for report in job.reports.values():
        for record in report["history"]:
            assert record["train_extra"] == 7.0  # rank 0's value alone, averaged over rank 0's samples
    assert job.reports[0]["history"] == job.reports[1]["history"]
    assert "ranks report different metrics (rank 0: extra, loss; rank 1: loss)" in job.stderr


def test_an_empty_micro_batch_runs_no_forward_pass(tmp_path):
    # 10 samples, batch 4, 2 ranks: the last step holds 2 samples, both on rank 0; rank 1 has nothing
    job = run_job(JOB, *_args("epochs=2", "batch_size=4", "extra.n_train=10", "extra.batchnorm=1",
                              "extra.nonfinite_empty=1"), out_dir=tmp_path, timeout=NO_HANG)

    assert job.returncode == 0, job.output
    for rank, report in job.reports.items():
        plan = SamplePlan(10, 4, 2, rank)
        non_empty = sum(not cell.is_empty for e in range(2) for step in plan.epoch(e) for cell in step)
        assert report["training_step_calls"] == non_empty
        assert report["batchnorm_batches"] == [non_empty]  # running statistics moved by real batches only
    assert job.reports[0]["params_sha256"] == job.reports[1]["params_sha256"]
    assert all(abs(p) < 1e6 for tensor in job.reports[0]["params"] for p in tensor)  # finite, no NaN


@pytest.mark.parametrize("np_", [1, 2])
def test_a_micro_batch_of_one_sample_for_batchnorm_is_a_clear_error_on_every_rank(tmp_path, np_):
    # 33 samples: with batch 4 the last step holds one sample, on 1 process as on 2 ranks (global batch 8)
    job = run_job(JOB, *_args("batch_size=4", "extra.n_train=33", "extra.batchnorm=1"), out_dir=tmp_path,
                  np=np_, timeout=NO_HANG)

    assert job.returncode == 2, job.output  # an uncaught ConfigError: one line, the bad-input status
    for rank in range(np_):
        lines = lines_of(job.stderr, rank)
        error = next(line for line in lines if "error:" in line)
        assert "config field 'batch_size': 4 leaves a micro-batch of 1 sample(s)" in error
        assert "BatchNorm1d" in error and "try batch_size 3 or 5" in error, error
    assert "Traceback" not in job.stderr
    assert not job.reports


def test_a_batchnorm_model_trains_when_the_short_step_can_give_every_micro_batch_two_samples(tmp_path):
    # 21 samples, batch 4, 4 ranks: 5 samples left for the last step go 3 + 2 (not 2 + 1 + 1 + 1)
    job = run_job(JOB, *_args("epochs=2", "batch_size=4", "extra.n_train=21", "extra.batchnorm=1"),
                  out_dir=tmp_path, np=4, timeout=NO_HANG)

    assert job.returncode == 0, job.output
    assert sorted(i for r in job.reports.values() for i in r["seen"]["1"]) == list(range(21))


def test_a_global_batch_larger_than_the_training_set_is_one_line_on_every_rank_before_training(tmp_path):
    # batch 32 on 2 ranks is a global batch of 64 for 37 samples: was one short step per epoch, its LR
    # scaled for 64
    job = run_job(JOB, *_args("batch_size=32", "extra.n_train=37"), out_dir=tmp_path, timeout=NO_HANG)

    assert job.returncode == 2, job.output
    for rank in (0, 1):
        errors = [line for line in lines_of(job.stderr, rank) if line.startswith("hvdazure: error:")]
        assert len(errors) == 1, job.stderr
        assert ("config field 'batch_size': the global batch of 64 samples (32 x 2 rank(s) x 1 "
                "grad_accum_steps) is larger than the 37 training samples") in errors[0]
        assert errors[0].endswith("use a batch_size of at most 18"), errors[0]
    assert "Traceback" not in job.stderr
    assert not job.reports and not list(tmp_path.glob("pid-*"))  # training never started
