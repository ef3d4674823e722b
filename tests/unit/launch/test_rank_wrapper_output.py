"""What a rank wrapper passes on of its command's output, and how it ends once it has reported.

Real processes, no Horovod: the wrapper runs a small Python command directly (a single-process "job"),
under `sh -c` as horovodrun starts it.
"""

import os
import select
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from hvdazure.launch.console import Segments

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the launchers' shell: Linux")

WRAPPER = [sys.executable, "-m", "hvdazure.launch.rank_wrapper", "--"]
NO_HANG_TIMEOUT = 30


def test_a_wrapper_that_has_reported_its_ranks_failure_is_not_killed_by_the_launchers_sigterm():
    """horovodrun (and `hvdazure run`) SIGTERM every rank once one has failed; a rank that had failed too
    and was already exiting died of it, and horovodrun's shell said `Terminated`: a line after the
    failure report, shown to users or not depending on which rank's exit was seen first."""
    command = " ".join([*WRAPPER, sys.executable, "-c", "'raise SystemExit(3)'"])
    shell = subprocess.Popen(["sh", "-c", f"env A=1 {command}"], stderr=subprocess.PIPE, text=True,
                             env={k: v for k, v in os.environ.items() if not k.startswith("HVDAZURE_")})
    wrapper = _child_of(shell.pid)
    lines = []
    stop = threading.Event()
    assert shell.stderr is not None
    for line in shell.stderr:  # until the wrapper has reported: then the launcher's SIGTERMs come
        lines.append(line)
        if "failed with exit code 3" in line:
            break
    storm = threading.Thread(target=_sigterm_until_gone, args=(wrapper, stop), daemon=True)
    storm.start()
    lines.extend(shell.stderr)
    code = shell.wait(timeout=NO_HANG_TIMEOUT)
    stop.set()
    storm.join()

    assert code == 3, lines
    assert "Terminated" not in "".join(lines), lines


def _child_of(pid: int) -> psutil.Process:
    deadline = time.monotonic() + NO_HANG_TIMEOUT
    while not psutil.Process(pid).children():
        assert time.monotonic() < deadline, "the wrapper did not start"
        time.sleep(0.01)
    return psutil.Process(pid).children()[0]


def _sigterm_until_gone(proc: psutil.Process, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            return
        time.sleep(0.0005)


def test_segments_end_at_a_newline_or_a_carriage_return_as_they_arrive():
    segments = Segments()

    assert segments.feed(b"epoch 1 10%\r") == [b"epoch 1 10%\r"]  # a redraw is passed on at once
    assert segments.feed(b"epoch 1 20%\repoch 1 30") == [b"epoch 1 20%\r"]
    assert segments.feed(b"%\rdone\r\nnext") == [b"epoch 1 30%\r", b"done\r\n"]  # \r\n: one line's end
    assert segments.feed(b" line\n") == [b"next line\n"]
    assert segments.feed(b"no end") == []
    assert segments.end() == [b"no end"]
    assert segments.end() == []


def test_the_wrapper_passes_each_redraw_on_as_it_comes_not_when_a_line_ends():
    """A progress display redraws its line with a carriage return: held until a newline, nobody would see
    it move."""
    script = ("import sys, time\n"
              "sys.stderr.write('step 1\\r'); sys.stderr.flush()\n"
              "time.sleep(60)\n")
    wrapper = subprocess.Popen([*WRAPPER, sys.executable, "-c", script], stderr=subprocess.PIPE,
                               env={k: v for k, v in os.environ.items() if not k.startswith("HVDAZURE_")})
    try:
        assert wrapper.stderr is not None
        started = wrapper.stderr.readline()  # the wrapper's own "rank 0 started on HOST"
        readable, _, _ = select.select([wrapper.stderr], [], [], NO_HANG_TIMEOUT / 3)
        redraw = os.read(wrapper.stderr.fileno(), 100) if readable else b"(nothing passed on)"
    finally:
        wrapper.terminate()
        wrapper.wait(timeout=NO_HANG_TIMEOUT)

    assert b"started on" in started
    assert redraw == b"step 1\r"
