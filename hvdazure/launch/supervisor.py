"""Runs a launcher process (mpirun/horovodrun), streams rank-tagged output, and stops the whole job promptly.

A job ends when the launcher exits. Three things end it early, each by stopping every rank: a rank reporting
failure (ranks left waiting in a collective would otherwise hang), the --timeout, and SIGINT/SIGTERM to
`hvdazure run` itself. Stopping sends SIGTERM to the ranks first and gives them a grace period to save a
checkpoint (the launcher is left alone meanwhile: horovodrun would kill them after 5 s), then SIGTERM to
the launcher and what is left, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TextIO

import psutil

from hvdazure.launch.command import RANK_WRAPPER_MODULE, LaunchSpec, build_command
from hvdazure.launch.exit_status import RankFailure, exit_code_of

TIMEOUT_EXIT_CODE = 124  # as coreutils' timeout(1)
_LAUNCHER_GRACE_S = 5.0
_MPI_TAG = re.compile(r"^\[\d+,(\d+)\]<(stdout|stderr)>:")
_HOROVODRUN_TAG = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:")


@dataclass(frozen=True)
class JobResult:
    """How a job ended: its exit code, the first rank that failed (if any), and whether it timed out."""

    exit_code: int
    failed_rank: int | None
    timed_out: bool
    duration_s: float


def normalize_line(line: str) -> tuple[str, bool]:
    """Rewrite mpirun's `[job,rank]<stream>:` tag to horovodrun's `[rank]<stream>:`; say if it is stderr."""
    match = _MPI_TAG.match(line)
    if match:
        line = f"[{match.group(1)}]<{match.group(2)}>:{line[match.end():]}"
    match = _HOROVODRUN_TAG.match(line)
    return line, bool(match and match.group(2) == "stderr")


class _Job:
    """One running launcher process and everything it started."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen(
            list(argv), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, text=True, bufsize=1, errors="replace",
        )
        self.failures: list[RankFailure] = []
        self.failed_at: float | None = None  # when the first failure line arrived (monotonic clock)
        self.stop_requested = threading.Event()
        self.stopped_by_signal: int | None = None  # SIGINT/SIGTERM received by `hvdazure run` itself
        self.stopping = False  # we stop the job (signal, timeout): the launcher's complaints are noise

    def on_signal(self, signum: int, _frame: object) -> None:
        self.stopped_by_signal = signum
        self.stop_requested.set()

    def pump_output(self, out: TextIO, err: TextIO) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line, is_err = normalize_line(raw)
            if self.stopping and not _HOROVODRUN_TAG.match(line):
                continue  # e.g. horovodrun's traceback about ranks that exited non-zero as told
            (err if is_err else out).write(line)
            (err if is_err else out).flush()
            failure = RankFailure.parse(line)
            if failure is not None:
                self.failures.append(failure)
                if self.failed_at is None:
                    self.failed_at = time.monotonic()
                    self.stop_requested.set()

    def stop(self, grace_s: float) -> None:
        """Stop every local process of the job; ranks get `grace_s` seconds after SIGTERM."""
        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            return
        self.stopping = self.failed_at is None  # a failure's launcher output may help; keep it
        ranks = [p for p in procs if _is_rank_wrapper(p)]
        _signal_all(ranks, signal.SIGTERM)
        psutil.wait_procs(ranks, timeout=grace_s)
        _signal_all(procs, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=_LAUNCHER_GRACE_S)
        _signal_all(alive, signal.SIGKILL)


def _is_rank_wrapper(proc: psutil.Process) -> bool:
    try:
        return RANK_WRAPPER_MODULE in proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _signal_all(procs: Sequence[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(sig)


def run_job(
    spec: LaunchSpec,
    timeout_s: float | None = None,
    grace_s: float = 30.0,
    failure_grace_s: float = 3.0,
    out: TextIO | None = None,
    err: TextIO | None = None,
    env: Mapping[str, str] | None = None,
) -> JobResult:
    """Run a job to completion and return how it ended; never leaves ranks running behind.

    `grace_s`: how long ranks may take to exit after SIGTERM on a timeout or a signal (a final checkpoint).
    `failure_grace_s`: after a rank failed, how long the launcher gets to stop the others by itself, and
    then how long they get after SIGTERM (they cannot save anything useful with a peer gone)."""
    out, err = out or sys.stdout, err or sys.stderr
    argv, job_env = build_command(spec, env)
    start = time.monotonic()
    job = _Job(argv, job_env)
    pump = threading.Thread(target=job.pump_output, args=(out, err), daemon=True)
    pump.start()

    previous = {}
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, job.on_signal)
    timed_out = False
    try:
        while job.proc.poll() is None:
            if job.stop_requested.wait(0.1):
                # Give the launcher a moment to tear down by itself after a rank failure (mpirun does), then
                # stop everything: survivors blocked in a collective would wait forever.
                if job.failed_at is not None:
                    remaining = failure_grace_s - (time.monotonic() - job.failed_at)
                    if remaining > 0 and _wait(job.proc, remaining):
                        break
                job.stop(grace_s if job.failed_at is None else failure_grace_s)
                break
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                timed_out = True
                job.stop(grace_s)
                break
        job.proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if job.proc.poll() is None:
            job.stop(grace_s)
    pump.join(timeout=5)

    duration = time.monotonic() - start
    if timed_out:
        err.write(f"hvdazure run: job exceeded --timeout {timeout_s:g}s; stopped all ranks\n")
        return JobResult(TIMEOUT_EXIT_CODE, None, True, duration)
    if job.stopped_by_signal is not None:
        name = signal.Signals(job.stopped_by_signal).name
        err.write(f"hvdazure run: received {name}; stopped all ranks\n")
        return JobResult(128 + job.stopped_by_signal, None, False, duration)
    if job.failures:
        first = min(job.failures)  # the root cause: not a follow-on failure, and earliest
        err.write(f"hvdazure run: rank {first.rank} failed first, with exit code {first.code}{first.detail}; "
                  f"stopped all ranks ({duration:.1f}s after start)\n")
        return JobResult(first.code, first.rank, False, duration)
    code, detail = exit_code_of(job.proc.returncode)
    if code != 0:
        err.write(f"hvdazure run: launcher exited with code {code}{detail}\n")
    return JobResult(code, None, False, duration)


def _wait(proc: subprocess.Popen, seconds: float) -> bool:
    try:
        proc.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False
