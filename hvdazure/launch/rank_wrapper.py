"""Runs one rank's command and, if it fails, says which rank failed and how, in one line on stderr.

mpirun and horovodrun start `python -m hvdazure.launch.rank_wrapper -- COMMAND...` on every rank. The
supervisor (launch/supervisor.py) reads the failure line from the tagged output to report the first failing
rank and its exit code. Signals sent to the wrapper (the launcher tearing the job down) are passed on.

The command's output is re-emitted a whole line per write: mpirun tags every chunk it reads, so an
unbuffered `print` (text and newline written separately) would otherwise come out split across tags.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from typing import BinaryIO

from hvdazure.core.cluster import detect_cluster
from hvdazure.launch.exit_status import PEER_SHUTDOWN_MARKERS, RankFailure, exit_code_of

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class _LinePump(threading.Thread):
    """Copies a child's stream a line at a time; notes if a peer's shutdown caused this rank's error."""

    def __init__(self, source: BinaryIO, sink: BinaryIO) -> None:
        super().__init__(daemon=True)
        self.source, self.sink = source, sink
        self.saw_peer_shutdown = False

    def run(self) -> None:
        for line in iter(self.source.readline, b""):
            self.sink.write(line)
            self.sink.flush()
            if not self.saw_peer_shutdown and any(m in line for m in PEER_SHUTDOWN_MARKERS):
                self.saw_peer_shutdown = True


def _say(line: str) -> None:
    """One write per line: with unbuffered stderr, print() writes the newline separately, and mpirun
    would tag the two pieces as two lines."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        _say("usage: python -m hvdazure.launch.rank_wrapper -- COMMAND [ARGS...]")
        return 2
    try:
        rank = detect_cluster().rank
    except ValueError as exc:  # a malformed launcher variable: say which, on every rank
        _say(f"hvdazure: error: {exc}")
        return 2
    try:
        child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
    except OSError as exc:
        failure = RankFailure(False, time.time(), rank, 127, f" (cannot start {args[0]!r}: {exc.strerror})")
        _say(failure.line())
        return 127
    pumps = [_LinePump(child.stdout, sys.stdout.buffer), _LinePump(child.stderr, sys.stderr.buffer)]
    for pump in pumps:
        pump.start()

    forwarded: int | None = None  # the last signal passed on to the command (the launcher stopping the job)

    def forward(signum: int, _frame: object) -> None:
        nonlocal forwarded
        forwarded = signum
        child.send_signal(signum)  # harmless if the command has just exited

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    returncode = child.wait()
    exited_at = time.time()
    for pump in pumps:
        pump.join(timeout=5)
    code, detail = exit_code_of(returncode)
    # An exit the forwarded signal explains (killed by it, or exiting 128 + it after saving) is the
    # launcher's doing, not a failure of this rank. Anything else is reported, signal or not.
    if code != 0 and not (forwarded is not None and code == 128 + forwarded):
        follow_on = any(pump.saw_peer_shutdown for pump in pumps)
        _say(RankFailure(follow_on, exited_at, rank, code, detail).line())
    return code


if __name__ == "__main__":
    sys.exit(main())
