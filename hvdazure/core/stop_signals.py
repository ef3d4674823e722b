"""SIGTERM/SIGINT during training: the first asks for a clean stop, a second ends the process at once.

The first signal only sets a flag that all ranks agree on at the next step (Trainer._vote_on_signal), so a
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

# The signals a training rank stops on (a first one cleanly); `hvdazure run` itself stops on more
# (launch/supervisor.py's SUPERVISOR_STOP_SIGNALS).
RANK_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DUPLICATE_WINDOW_S = 0.5


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
