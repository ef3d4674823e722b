"""A failing, killed or hung rank stops the whole job promptly, and the exit status says which rank."""

import os
import signal
import subprocess
import sys
import time

import pytest
from harness import CONTROLLERS, WORKERS, processes_running, read_reports, run_job

# A failed job must end long before this; the harness turns a longer wait into a "job hung" failure.
NO_HANG_TIMEOUT = 60


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_rank_exiting_nonzero_stops_all_ranks_with_its_exit_code(tmp_path, controller):
    job = run_job("misbehave.py", "exit", "3", out_dir=tmp_path, controller=controller,
                  timeout=NO_HANG_TIMEOUT)

    assert job.returncode == 3, job.output
    assert "hvdazure run: rank 1 failed first, with exit code 3" in job.stderr
    assert not processes_running(str(WORKERS / "misbehave.py"))


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_rank_killed_by_sigkill_is_reported_as_such(tmp_path, controller):
    job = run_job("misbehave.py", "sigkill", out_dir=tmp_path, controller=controller, timeout=NO_HANG_TIMEOUT)

    assert job.returncode == 128 + signal.SIGKILL, job.output
    assert "rank 1 failed first, with exit code 137 (killed by SIGKILL)" in job.stderr
    assert not processes_running(str(WORKERS / "misbehave.py"))


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_timeout_stops_every_rank_and_exits_124(tmp_path, controller):
    job = run_job("misbehave.py", "hang", out_dir=tmp_path, controller=controller,
                  launcher_args=("--timeout", "8"), timeout=NO_HANG_TIMEOUT)

    assert job.returncode == 124, job.output
    assert "hvdazure run: job exceeded --timeout 8s; stopped all ranks" in job.stderr
    assert sorted(job.reports) == [0, 1]  # both ranks had started before the timeout
    assert not processes_running(str(WORKERS / "misbehave.py"))


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_sigterm_to_the_launcher_reaches_every_rank(tmp_path, controller):
    cmd = [sys.executable, "-m", "hvdazure.cli", "run", "-np", "2", f"--{controller}",
           str(WORKERS / "misbehave.py"), "sigterm"]
    proc = subprocess.Popen(cmd, env={**os.environ, "HVDAZURE_TEST_OUT": str(tmp_path)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + NO_HANG_TIMEOUT
        while len(read_reports(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(read_reports(tmp_path)) == 2, "ranks did not start"
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=NO_HANG_TIMEOUT)
    finally:
        proc.kill()

    assert proc.returncode == 128 + signal.SIGTERM, output
    assert "hvdazure run: received SIGTERM; stopped all ranks" in output
    reports = read_reports(tmp_path)
    assert all(report.get("got_sigterm") for report in reports.values()), (reports, output)
    assert not processes_running(str(WORKERS / "misbehave.py"))
