"""Runs one rank's command and, if it fails, says which rank failed and how, in one line on stderr.

mpirun and horovodrun start `python -m hvdazure.launch.rank_wrapper -- COMMAND...` on every rank. The
supervisor (launch/supervisor.py) reads the failure line from the tagged output to report the first failing
rank and its exit code. Signals sent to the wrapper (the launcher tearing the job down) are passed on.

The command never outlives the wrapper, and the wrapper does not outlive its parent (mpirun, orted, or
horovodrun's shell), even when either is killed outright (see launch/lifetime.py): the command gets
SIGKILL if the wrapper dies; the wrapper gets SIGTERM if its parent dies, passes it on, and kills the
command if it is still running `HVDAZURE_GRACE_S` seconds later (`hvdazure run --grace`; default 30).
This covers ranks on other nodes too, which no process of `hvdazure run` can see.

The wrapper also says where the rank started, and that it exited when it did not fail (see
launch/exit_status.py): a rank that says neither was lost, with its node or the network to it.

The command's output is re-emitted a whole segment per write, a segment being a line or a redraw (text
ended by a carriage return: a progress display, passed on as it comes; launch/console.py): mpirun tags
every chunk it reads, so an unbuffered `print` (text and newline written separately) would otherwise come
out split across tags.

Once the wrapper has said how its rank ended, the launcher's signals no longer reach it: horovodrun and
`hvdazure run` SIGTERM every rank when one fails, and a wrapper killed on its way out would make
horovodrun's shell print `Terminated` after the report.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO

from hvdazure.core.environments import detect_cluster
from hvdazure.launch.console import Segments
from hvdazure.launch.exit_status import (
    PEER_SHUTDOWN_MARKERS,
    PEER_TIMEOUT_DETAIL,
    PEER_TIMEOUT_MARKER,
    RankFailure,
    exit_code_of,
    exited_line,
    started_line,
)
from hvdazure.launch.lifetime import LAUNCHER_ENV, die_with_parent, die_with_this_process, process_gone

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
GRACE_ENV = "HVDAZURE_GRACE_S"  # set by `hvdazure run` from --grace
_DEFAULT_GRACE_S = 30.0
_POLL_S = 1.0  # how often the wrapper checks that its parent is still there
_SIGNAL_POLL_S = 0.05  # how often a wait for the launcher's signal checks whether it came
# How long a rank that failed only because a peer had gone waits before it reports and exits (unless the
# launcher signals it first). The peer may take seconds to finish exiting after Horovod has shut down
# (freeing a large model, joining data loader workers); if this rank exited first, the launcher would
# tear the job down and kill that peer before it could report, and the job would blame this rank.
_FOLLOW_ON_DELAY_S = 10.0
# How long a rank that stopped on bad input (exit status 2: hvdazure's one-line error, before training)
# waits before it reports and exits (unless the launcher signals it first). Every rank parses the same
# input and says the same; without the wait, horovodrun and mpirun kill the ranks that are a moment
# behind (still importing their framework) before they can say it.
_BAD_INPUT_HOLD_S = 3.0
BAD_INPUT_STATUS = 2
_CHUNK_BYTES = 65536  # read from the command's pipes at most at a time


class _LinePump(threading.Thread):
    """Copies a child's stream a segment (a line, or a redraw) at a time as it comes; notes if a peer's
    shutdown caused this rank's error."""

    def __init__(self, source: IO[bytes], sink: IO[bytes]) -> None:
        super().__init__(daemon=True)
        self.source, self.sink = source, sink
        self.saw_peer_shutdown = False
        self.saw_peer_timeout = False

    def _segments(self) -> Iterator[bytes]:
        segments = Segments()
        while chunk := self.source.read1(_CHUNK_BYTES):  # type: ignore[attr-defined]  # a BufferedReader
            yield from segments.feed(chunk)
        yield from segments.end()

    def run(self) -> None:
        sink: IO[bytes] | None = self.sink
        for line in self._segments():
            if sink is not None:
                try:
                    sink.write(line)
                    sink.flush()
                except OSError:  # the launcher is gone: keep draining, or the command blocks writing
                    sink = None
            if not self.saw_peer_shutdown and any(m in line for m in PEER_SHUTDOWN_MARKERS):
                self.saw_peer_shutdown = True
            if PEER_TIMEOUT_MARKER in line:
                self.saw_peer_timeout = True


class _SignalForwarder:
    """Passes signals on to the command; remembers which, so that an exit they explain is not a failure.

    Installed before the command starts: a signal arriving meanwhile is passed on as soon as it exists.
    The handler takes no lock: it runs between two bytecodes of the main thread, which may be holding the
    very lock (a threading.Event's, while it waits on it), and would then wait for itself forever."""

    def __init__(self) -> None:
        self.child: subprocess.Popen | None = None
        self.signals: set[int] = set()

    def __call__(self, signum: int, _frame: object = None) -> None:
        self.signals.add(signum)
        if self.child is not None:
            self.child.send_signal(signum)  # lock-free (Popen polls without blocking); harmless if it exited

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a signal to arrive (by polling: the handler sets no Event);
        whether one has."""
        deadline = time.monotonic() + timeout
        while not self.signals and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(_SIGNAL_POLL_S, left))
        return bool(self.signals)

    def attach(self, child: subprocess.Popen) -> None:
        self.child = child
        for signum in sorted(self.signals):
            child.send_signal(signum)

    def caused_exit(self, code: int) -> bool:
        """An exit the launcher asked for: killed by a forwarded signal, or exiting 128 + it after saving."""
        return code - 128 in self.signals


def _write_stderr_line(line: str) -> None:
    """One write per line: with unbuffered stderr, print() writes the newline separately, and mpirun
    would tag the two pieces as two lines."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _grace_s() -> float:
    try:
        return float(os.environ.get(GRACE_ENV, _DEFAULT_GRACE_S))
    except ValueError:
        return _DEFAULT_GRACE_S


class _OrphanWatch(threading.Thread):
    """Stops the command if this wrapper is orphaned (its parent died), or if the `hvdazure run` that
    started the job is gone (on its machine; lifetime.LAUNCHER_ENV): SIGTERM (the parent-death signal has
    usually delivered it already), then SIGKILL after the grace period. Once the command has ended, an
    orphaned wrapper still here a grace period later (stuck reporting to a launcher that is gone) exits
    outright: nothing of the job outlives its launcher by more than that."""

    def __init__(self, child: subprocess.Popen, forward: _SignalForwarder) -> None:
        super().__init__(daemon=True)
        self.child, self.forward = child, forward
        self.parent = os.getppid()
        self.launcher = os.environ.get(LAUNCHER_ENV)
        self.command_exited = threading.Event()

    def run(self) -> None:
        while not self.command_exited.wait(_POLL_S):
            if self._orphaned():
                if signal.SIGTERM not in self.forward.signals:  # no parent-death signal on this system
                    self.forward(signal.SIGTERM)
                if not self.command_exited.wait(_grace_s()):
                    self.child.kill()
                break
        while not self._orphaned():
            time.sleep(_POLL_S)
        time.sleep(_grace_s())
        os._exit(1 if self.child.returncode is None else exit_code_of(self.child.returncode)[0])

    def _orphaned(self) -> bool:
        return os.getppid() != self.parent or (self.launcher is not None and process_gone(self.launcher))


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        _write_stderr_line("usage: python -m hvdazure.launch.rank_wrapper -- COMMAND [ARGS...]")
        return 2
    try:
        rank = detect_cluster().rank
    except ValueError as exc:  # a malformed launcher variable: say which, on every rank
        _write_stderr_line(f"hvdazure: error: {exc}")
        return 2
    forward = _SignalForwarder()
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    _write_stderr_line(started_line(rank, socket.gethostname()))
    try:
        child = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, preexec_fn=die_with_this_process(signal.SIGKILL))
    except OSError as exc:
        failure = RankFailure(False, time.time(), rank, 127, f" (cannot start {args[0]!r}: {exc.strerror})")
        _write_stderr_line(failure.line())
        return 127
    forward.attach(child)
    assert child.stdout is not None and child.stderr is not None  # both are pipes
    pumps = [_LinePump(child.stdout, sys.stdout.buffer), _LinePump(child.stderr, sys.stderr.buffer)]
    for pump in pumps:
        pump.start()
    watch = _OrphanWatch(child, forward)
    watch.start()
    returncode = child.wait()
    exited_at = time.time()
    watch.command_exited.set()
    for pump in pumps:
        pump.join(timeout=5)
    code, detail = exit_code_of(returncode)
    # An exit the forwarded signal explains is the launcher's doing, not a failure of this rank. Anything
    # else is reported, signal or not.
    if code != 0 and not forward.caused_exit(code):
        timed_out = any(pump.saw_peer_timeout for pump in pumps)
        follow_on = not timed_out and any(pump.saw_peer_shutdown for pump in pumps)
        if timed_out:
            detail += PEER_TIMEOUT_DETAIL
        if follow_on:  # let the rank that failed first report first
            forward.wait(_FOLLOW_ON_DELAY_S)
        elif code == BAD_INPUT_STATUS:  # let the other ranks name the bad input too
            forward.wait(_BAD_INPUT_HOLD_S)
        _write_stderr_line(RankFailure(follow_on, exited_at, rank, code, detail).line())
    else:
        _write_stderr_line(exited_line(rank, code))
    return code


def _deaf_to(signals: tuple[signal.Signals, ...]) -> None:
    """Ignore `signals` from now on, through the interpreter's exit (which would restore their default
    action, death, for handlers set in Python: not for ignored signals)."""
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)


if __name__ == "__main__":
    die_with_parent(signal.SIGTERM)  # here, not in main(): it changes the process for good
    exit_code = main()  # the rank's end is reported: from here on, the process only exits
    _deaf_to(FORWARDED_SIGNALS)
    sys.exit(exit_code)
