"""The demo's console under `hvdazure run`, as a user sees it: on a terminal (a pseudo-terminal here), rank
0's progress display redrawn in place, one line left per epoch, no launcher tags; through a pipe (Azure ML's
logs, CI), log lines with neither carriage returns nor terminal codes."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
from harness import CONTROLLERS, REPO, kill_tree

DEMO = [str(REPO / "samples" / "torch_digits.py"), "--set", "epochs=2"]
TIMEOUT = 240
COLUMNS = 150
_TERMINAL = re.compile(r"\x1b\[K|\r|\n|[^\r\n\x1b]+")


def _command(controller: str) -> list[str]:
    return [sys.executable, "-m", "hvdazure.cli", "run", "-np", "2", f"--{controller}", *DEMO]


def _on_a_terminal(command: list[str]) -> str:
    """What `command` writes, stdout and stderr both on one pseudo-terminal COLUMNS wide."""
    main, terminal = os.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, COLUMNS, 0, 0))
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, cwd=REPO)
    os.close(terminal)
    written, deadline = b"", time.monotonic() + TIMEOUT
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                kill_tree(proc.pid)
                raise AssertionError(f"job hung:\n{written.decode(errors='replace')}")
            if select.select([main], [], [], left)[0]:
                try:
                    chunk = os.read(main, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not chunk:
                    break
                written += chunk
        assert proc.wait(timeout=30) == 0, written.decode(errors="replace")
    finally:
        os.close(main)
    return written.decode(errors="replace")


def _screen(written: str) -> list[str]:
    """The lines a terminal shows for `written`: a carriage return goes back to the line's start, `ESC[K`
    erases the rest of the line, text overwrites."""
    lines, line, column = [], "", 0
    for token in _TERMINAL.findall(written):
        if token == "\r":
            column = 0
        elif token == "\n":
            lines.append(line)
            line, column = "", 0
        elif token == "\x1b[K":
            line = line[:column]
        else:
            line = line[:column] + token + line[column + len(token):]
            column += len(token)
    return [*lines, line] if line else lines


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_on_a_terminal_rank_0_redraws_its_progress_in_place_and_leaves_one_line_per_epoch(controller):
    written = _on_a_terminal(_command(controller))
    screen = _screen(written)

    for epoch in (1, 2):  # drawn in place, untagged, with the step count, loss and samples/s
        assert re.search(rf"\r\x1b\[Kepoch {epoch}/2 +\d+%\|.*\| \d+/23 \[", written), written
        assert [line for line in screen if line.startswith(f"hvdazure: epoch {epoch} done: ")], screen
    assert re.search(r"\r\x1b\[Kepoch \d/2 .* \d+/23 \[.*loss [\d.e+-]+ .*samples/s [\d.e+]+\]", written)
    # the bars are gone from the screen: each epoch left its one line, and nothing is tagged
    assert not [line for line in screen if re.match(r"epoch \d/2 ", line)], screen
    redraws = re.findall(r"\r\x1b\[K(epoch [^\r\n]*)", written)
    assert all(len(bar) < COLUMNS for bar in redraws), redraws  # none wraps (it could not be redrawn)
    assert "<stderr>" not in written and "<stdout>" not in written and "[rank " not in written, screen
    assert "final: eval accuracy" in screen[-1] or any(line.startswith("final: ") for line in screen)


def test_through_a_pipe_the_same_run_logs_lines_without_carriage_returns_or_terminal_codes():
    job = subprocess.run(_command("mpi"), capture_output=True, text=True, cwd=REPO, timeout=TIMEOUT,
                         stdin=subprocess.DEVNULL)

    assert job.returncode == 0, job.stderr
    assert "\r" not in job.stdout + job.stderr and "\x1b" not in job.stdout + job.stderr
    lines = job.stderr.splitlines()
    assert "hvdazure: epoch 1 step 10/23 " in "\n".join(lines) and lines.count("") == 0
    assert len([line for line in lines if "where the time went" in line]) == 1  # the table, once
    assert job.stdout.startswith("final: eval accuracy")
    assert "<stderr>" not in job.stderr and "[rank " not in job.stderr
