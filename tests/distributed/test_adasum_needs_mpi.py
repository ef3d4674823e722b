"""Adasum under Gloo is refused before training, on every rank, in one line: Horovod has Adasum only under
MPI (under Gloo every rank used to train one step, then die with `No Adasum operation enabled`)."""

import pytest
from harness import run_job
from rank_output import lines_of

NO_HANG_TIMEOUT = 120


@pytest.mark.parametrize("worker", ["torch_job.py", "tf_job.py"])
def test_adasum_under_gloo_is_refused_before_training_on_every_rank(tmp_path, worker):
    job = run_job(worker, "--set", "reduce_op=adasum", out_dir=tmp_path, controller="gloo",
                  timeout=NO_HANG_TIMEOUT)

    assert job.returncode == 2, job.output  # the bad-input status: every rank is let to say it
    for rank in (0, 1):
        errors = [line for line in lines_of(job.stderr, rank) if line.startswith("hvdazure: error:")]
        assert len(errors) == 1, job.stderr
        assert "'reduce_op': 'adasum' needs the MPI controller, but Horovod runs on gloo" in errors[0]
        assert "--mpi" in errors[0]
    assert "Traceback" not in job.output and "No Adasum" not in job.output
    assert not list(tmp_path.glob("pid-*")), "training started"
    assert not job.reports
