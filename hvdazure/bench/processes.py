"""Starting a benchmark's own processes and waiting for them, the one way jobs.py (single-rank processes),
launch.py (the launchers it times) and peers.py (each peer's launcher) do it.

Every process starts in a session of its own, so that its whole process group (a launcher's ranks too) can
be stopped at once, with its output in a log file, read when it failed. Past the timeout, or when the wait
is interrupted (Ctrl-C, an error), every group still running gets SIGTERM, then SIGKILL; a timeout is a
one-line BenchError naming the command. The wait ends the moment the last process exits (a pidfd, not
polling), so that launch.py's wall times stay exact.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hvdazure.bench.benchmark import BenchError

STOP_GRACE_S = 10.0  # after SIGTERM, before SIGKILL


@dataclass(frozen=True)
class Command:
    """One process to start: its argv, its whole environment, and the file its stdout and stderr go to."""

    argv: Sequence[str]
    env: Mapping[str, str]
    log: Path

    def describe(self) -> str:
        """The command in one line: its first three words, `python -m hvdazure.cli ...` (each word's own
        whitespace folded, a long one cut)."""
        words = [" ".join(word.split()) for word in self.argv[:3]]
        text = " ".join(word if len(word) <= 60 else word[:57] + "..." for word in words)
        return f"`{text} ...`" if len(self.argv) > 3 else f"`{text}`"

    def last_lines(self, count: int) -> list[str]:
        """The last `count` lines of what the process printed."""
        return self.log.read_text().strip().splitlines()[-count:] if self.log.is_file() else []


def run_together(commands: Sequence[Command], timeout_s: float | None, what: str) -> list[int]:
    """Start every command at once and wait for all of them; their exit codes, in order. `what` starts the
    timeout's error line (the benchmark, and which run of it)."""
    procs: list[subprocess.Popen[bytes]] = []
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        for command in commands:
            procs.append(_start(command, what))
        for command, proc in zip(commands, procs, strict=True):
            if not _exited_by(proc, deadline):
                raise BenchError(f"{what}: {command.describe()} still ran after --timeout {timeout_s:g} s, "
                                 "stopped")
        return [proc.returncode for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                stop_group(proc)


def _start(command: Command, what: str) -> subprocess.Popen[bytes]:
    """Start `command` in a session of its own, reading nothing, printing into its log."""
    with command.log.open("w") as sink:
        try:
            return subprocess.Popen(list(command.argv), env=dict(command.env), stdin=subprocess.DEVNULL,
                                    stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:  # a launcher that is not there
            raise BenchError(f"{what}: cannot start {command.describe()}: {exc}") from None


def _exited_by(proc: subprocess.Popen[bytes], deadline: float | None) -> bool:
    """Wait for `proc` until `deadline` (time.monotonic(); None: no limit); whether it exited. Woken by the
    process's pidfd when it exits (Popen.wait with a timeout polls, up to 50 ms late)."""
    if deadline is None:
        proc.wait()
        return True
    remaining = max(0.0, deadline - time.monotonic())
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux 5.3+: Popen's polling
        try:
            proc.wait(timeout=remaining)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        exited, _, _ = select.select([pidfd], [], [], remaining)
    finally:
        os.close(pidfd)
    if exited:
        proc.wait()
    return bool(exited)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop `proc`'s process group (its session): SIGTERM, then SIGKILL after STOP_GRACE_S."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
