"""SIGTERM/SIGINT during training: the first asks for a clean stop, a second ends the process at once.

The first signal only sets a flag that all ranks agree on at the next step (StopRequests.vote), so a
final checkpoint is written together. That cannot help a rank that is stuck: blocked in a collective whose
peer died, or in a long evaluation. A second signal therefore exits immediately with 128 + the signal.

Python runs signal handlers in the main thread between bytecodes, never while that thread waits inside a
C++ collective, so the second signal is caught by a watcher thread instead: the interpreter's C-level
handler writes the signal number to a wakeup pipe (signal.set_wakeup_fd) even when the main thread is
blocked, and the watcher counts them. Copies of one stop arrive together (seen here: a launcher and the
rank's wrapper both passing one SIGTERM on, 0.1 ms apart): signals within DUPLICATE_WINDOW_S of the first
count as that one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from hvdazure.core.rank_logging import logger

# The signals a training rank stops on (a first one cleanly); `hvdazure run` itself stops on more
# (launch/supervisor.py's SUPERVISOR_STOP_SIGNALS).
RANK_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DUPLICATE_WINDOW_S = 0.5


class StopRequests:
    """This rank's request to stop cleanly during fit(): the first stop signal it received, or a request
    naming its reason (`request`, e.g. a watcher of the cloud's preemption notices). It travels in the
    per-step vote (no collective of its own); when any rank voted, every rank saves a checkpoint together
    and exits with 128 + the signal number. Only while checkpointing: without it, signals end the process
    as usual."""

    def __init__(self) -> None:
        self.signum: int | None = None  # a stop signal this rank received
        self.reason: str | None = None  # what asked for it, when not a real signal

    def caught(self, checkpointing: bool) -> contextlib.AbstractContextManager[Any]:
        """While checkpointing, a first SIGTERM/SIGINT only sets a flag: all ranks agree on it at the next
        step, save a final checkpoint together, and exit with 128 + the signal number. A second one exits
        at once (`stop_signals_caught`)."""
        if not checkpointing:
            return contextlib.nullcontext()
        return stop_signals_caught(self.note_signal)

    def note_signal(self, signum: int) -> None:
        """A stop signal this rank received (the handler's side of `caught`)."""
        self.signum = self.signum or signum

    def request(self, reason: str, signum: int) -> None:
        """Ask for a stop as a first `signum` does, named `reason`; safe from any thread."""
        if self.signum is None:
            self.reason = reason
            self.signum = signum

    def vote(self, checkpointing: bool) -> float | None:
        """This rank's vote to stop for a signal, summed over ranks during the step; None when signals are
        not caught (no checkpointing: they end the process as usual)."""
        return None if not checkpointing else float(self.signum is not None)

    def stop(self, save_checkpoint: Callable[[str], str | None]) -> NoReturn:
        """Some rank voted to stop: save a checkpoint (every rank, together); exit with 128 + the signal."""
        name = signal.Signals(self.signum).name if self.signum else "a stop signal on another rank"
        what = self.reason or name
        saved = save_checkpoint(f"signal: {what}")
        logger.warning(f"received {what}: saved checkpoint {saved}; exiting")
        raise SystemExit(128 + (self.signum or signal.SIGTERM))


@contextlib.contextmanager
def stop_signals_caught(on_first: Callable[[int], None]) -> Iterator[None]:
    """Within the block, the first SIGTERM/SIGINT calls `on_first(signum)`; a second exits the process.

    Only in the main thread (Python's rule for signal handlers); elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    watcher = threading.Thread(target=_exit_on_second_signal, args=(read_end,), name="hvdazure-signals",
                               daemon=True)
    previous_handlers = {sig: signal.signal(sig, lambda signum, _frame: on_first(signum))
                         for sig in RANK_STOP_SIGNALS}
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        os.close(write_end)  # the watcher reads end-of-file and returns
        watcher.join(timeout=5)
        os.close(read_end)


def _exit_on_second_signal(read_end: int) -> None:
    first: float | None = None
    while data := os.read(read_end, 64):
        for signum in data:
            if signum not in RANK_STOP_SIGNALS:
                continue
            if first is None:
                first = time.monotonic()
            elif time.monotonic() - first >= DUPLICATE_WINDOW_S:
                name = signal.Signals(signum).name
                message = (f"hvdazure: second {name} while stopping: exiting now, without waiting for the "
                           f"other ranks or a final checkpoint (exit {128 + signum})\n")
                os.write(2, message.encode())
                os._exit(128 + signum)
