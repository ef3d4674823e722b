"""A second SIGTERM/SIGINT ends a rank at once, even one blocked in a collective whose peer is gone."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil
from harness import WORKERS, processes_running

JOB = "torch_job.py"
SETTINGS = ("epochs=50", "batch_size=4", "extra.n_train=37", "extra.step_sleep=0.05")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_second_sigterm_ends_a_rank_blocked_in_a_collective_at_once(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    args = [a for s in (*SETTINGS, f"checkpoint_dir={tmp_path / 'ckpt'}") for a in ("--set", s)]
    cmd = [sys.executable, "-m", "hvdazure.cli", "run", "-np", "2", "--gloo", str(WORKERS / JOB), *args]
    job = subprocess.Popen(cmd, env={**os.environ, "HVDAZURE_TEST_OUT": str(out)}, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        _wait(lambda: (out / "pid-0").exists() and (out / "pid-1").exists(), "both ranks to train")
        rank0, rank1 = (int((out / f"pid-{r}").read_text()) for r in (0, 1))
        os.kill(rank1, signal.SIGSTOP)  # a peer that never answers: rank 0 blocks in the next collective
        time.sleep(2)
        os.kill(rank0, signal.SIGTERM)  # asks for a clean stop, which needs rank 1
        time.sleep(1)
        assert _alive(rank0), "the first SIGTERM alone must not end the rank"
        os.kill(rank0, signal.SIGTERM)
        # was: rank 0 stayed blocked until rank 1 was killed (only SIGKILL ended it)
        _wait(lambda: not _alive(rank0), "rank 0 to exit after the second SIGTERM", timeout=20)
        os.kill(rank1, signal.SIGKILL)
        output, _ = job.communicate(timeout=60)
    finally:
        job.kill()
        for pid_file in out.glob("pid-*"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)

    assert "second SIGTERM while stopping: exiting now" in output, output
    assert "rank 0 failed" in output and "exit code 143" in output, output
    assert not processes_running(str(WORKERS / JOB))
