"""Signals to `hvdazure run` itself stop the whole job, and killing it outright leaves no process behind.

SIGTERM and SIGHUP (a closed terminal, a dropped ssh session) give every rank SIGTERM and `--grace`
seconds to save, and `hvdazure run` exits 128 + the signal it received. SIGKILL (or the OOM killer) cannot
be caught: the job's processes must still end, by the kernel's parent-death signals.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from harness import CONTROLLERS, WORKERS, processes_running, read_reports

NO_HANG_TIMEOUT = 120
SCRIPT = str(WORKERS / "misbehave.py")


def _start_job(out_dir, controller):
    """`hvdazure run` of two ranks that record the SIGTERM they receive; returns once both are running."""
    cmd = [sys.executable, "-m", "hvdazure.cli", "run", "-np", "2", f"--{controller}", SCRIPT, "sigterm"]
    proc = subprocess.Popen(cmd, env={**os.environ, "HVDAZURE_TEST_OUT": str(out_dir)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + NO_HANG_TIMEOUT
    while len(read_reports(out_dir)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    if len(read_reports(out_dir)) < 2:
        proc.kill()
        raise AssertionError(f"ranks did not start:\n{proc.communicate()[0]}")
    return proc


def _stop(proc, sig):
    """Send `sig` to `hvdazure run` and return its exit code and output."""
    try:
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=NO_HANG_TIMEOUT)
    finally:
        proc.kill()
    return proc.returncode, output


@pytest.mark.parametrize("controller", CONTROLLERS)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda sig: sig.name)
def test_sigterm_or_sighup_to_the_launcher_gives_every_rank_sigterm(tmp_path, controller, sig):
    returncode, output = _stop(_start_job(tmp_path, controller), sig)

    assert returncode == 128 + sig, output
    assert f"hvdazure run: received {sig.name}; stopped all ranks" in output
    reports = read_reports(tmp_path)
    assert all(report.get("got_sigterm") for report in reports.values()), (reports, output)
    assert "failed" not in output, "ranks that stopped as asked were reported as failed"
    assert not processes_running(SCRIPT)


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_sigkill_of_the_launcher_leaves_no_process_of_the_job(tmp_path, controller):
    proc = _start_job(tmp_path, controller)
    job = psutil.Process(proc.pid).children(recursive=True)
    try:
        proc.kill()
        proc.wait()
        alive = _still_running(job, within_s=NO_HANG_TIMEOUT)
        described = [_describe(p) for p in alive]  # before they are killed below: then they are zombies
    finally:
        for leftover in _still_running(job, within_s=0):
            leftover.kill()

    assert not alive, described
    assert not processes_running(SCRIPT)


def _still_running(procs, within_s):
    """Those of `procs` still running (zombies count as ended) after waiting up to `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        alive = [p for p in procs if _running(p)]
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def _describe(proc):
    """What a process left behind was doing: its command line, state, parent and kernel wait channel."""
    try:
        with proc.oneshot():
            info = {"pid": proc.pid, "cmdline": proc.cmdline(), "status": proc.status(), "ppid": proc.ppid()}
        info["wchan"] = Path(f"/proc/{proc.pid}/wchan").read_text()
        return info
    except (psutil.NoSuchProcess, OSError) as exc:
        return {"pid": proc.pid, "gone": repr(exc)}


def _running(proc):
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False



def test_ranks_stop_when_the_launcher_is_killed_even_if_the_controllers_processes_cannot_act(tmp_path):
    """The ranks of a job whose `hvdazure run` is SIGKILLed must not depend on the controller's processes
    (horovodrun, its per-rank middlemen) to be stopped: here those are frozen (SIGSTOP) before the kill,
    as one that missed or mishandled its parent-death signal would be; each rank's wrapper sees that the
    `hvdazure run` that started the job is gone, and gives its rank SIGTERM, then SIGKILL after --grace.
    Before, the ranks ran on for as long as the frozen middlemen lived (1 run in ~10 of the test above)."""
    cmd = [sys.executable, "-m", "hvdazure.cli", "run", "-np", "2", "--gloo", "--grace", "3", SCRIPT,
           "sigterm"]
    proc = subprocess.Popen(cmd, env={**os.environ, "HVDAZURE_TEST_OUT": str(tmp_path)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + NO_HANG_TIMEOUT
    while len(read_reports(tmp_path)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    job = psutil.Process(proc.pid).children(recursive=True)
    ranks = [p for p in job if p.cmdline()[1:2] == [SCRIPT]]  # python SCRIPT sigterm
    controller = [p for p in job if p not in ranks and "hvdazure.launch.rank_wrapper" not in p.cmdline()
                  and p.name() != "sh"]
    try:
        assert len(ranks) == 2 and controller, [p.cmdline() for p in job]
        for frozen in controller:
            frozen.send_signal(signal.SIGSTOP)
        proc.kill()
        proc.wait()
        alive = _still_running(ranks, within_s=30)
        described = [_describe(p) for p in alive]
    finally:
        for leftover in _still_running(job, within_s=0):
            leftover.kill()

    assert not alive, described
    reports = read_reports(tmp_path)
    assert all(report.get("got_sigterm") for report in reports.values()), reports
