"""The rank wrapper never leaves its command running: not when it is killed, nor when its own parent dies.

Real processes, no Horovod: the wrapper runs a small Python command directly (a single-process "job").
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hvdazure.launch import rank_wrapper
from hvdazure.launch.exit_status import RankFailure

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals: Linux")

NO_HANG_TIMEOUT = 30
WRAPPER = [sys.executable, "-m", "hvdazure.launch.rank_wrapper", "--"]

# The wrapped command: writes its pid, then sleeps. On SIGTERM it writes "sigterm" and exits 143, or, with
# "ignore", ignores SIGTERM (a command stuck where it cannot react); with "flood", it first writes 1 MB to
# stderr.
COMMAND = """
import os, signal, sys, time
from pathlib import Path
out, mode = Path(sys.argv[1]), sys.argv[2]
def on_sigterm(signum, frame):
    (out / "sigterm").write_text("1")
    sys.exit(143)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "ignore" else on_sigterm)
(out / "pid.tmp").write_text(str(os.getpid()))
(out / "pid.tmp").rename(out / "command.pid")
if mode == "flood":  # more than a pipe holds: the wrapper blocks passing it on if nobody reads it
    sys.stderr.write("x" * 2**20 + "\\n")
while True:
    time.sleep(0.1)
"""

# A parent that starts the wrapper from its main thread, says the wrapper's pid, and waits to be killed.
PARENT = """
import subprocess, sys, time
wrapper = subprocess.Popen(sys.argv[1:])
print(wrapper.pid, flush=True)
time.sleep(3600)
"""


def _wrapped_command(out: Path, mode: str = "record") -> list[str]:
    return [*WRAPPER, sys.executable, "-c", COMMAND, str(out), mode]


def _wait_for_command(out: Path) -> psutil.Process:
    deadline = time.monotonic() + NO_HANG_TIMEOUT
    while not (out / "command.pid").exists():
        assert time.monotonic() < deadline, "the wrapped command did not start"
        time.sleep(0.05)
    return psutil.Process(int((out / "command.pid").read_text()))


def _gone_within(procs: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    """The processes still running (zombies count as gone) after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        alive = [p for p in procs if _running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        if _running(proc):
            proc.kill()


def test_the_command_dies_when_its_wrapper_is_killed(tmp_path):
    wrapper = subprocess.Popen(_wrapped_command(tmp_path))
    command = _wait_for_command(tmp_path)
    try:
        wrapper.kill()
        wrapper.wait()
        alive = _gone_within([command], NO_HANG_TIMEOUT)
    finally:
        _kill_all([command])

    assert not alive, "the command outlived its SIGKILLed wrapper"


def _orphan_wrapper(out: Path, mode: str, stderr: int | None = None,
                    grace_s: float = 30) -> list[psutil.Process]:
    """Start the wrapped command under PARENT, kill PARENT once the command runs, and return those of the
    wrapper and the command still running NO_HANG_TIMEOUT later. Nothing is left behind, even on failure."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, *_wrapped_command(out, mode)],
                              stdout=subprocess.PIPE, stderr=stderr, text=True,
                              env={**os.environ, "HVDAZURE_GRACE_S": str(grace_s)})
    started: list[psutil.Process] = []
    try:
        started.append(psutil.Process(int(parent.stdout.readline())))
        started.append(_wait_for_command(out))
        parent.kill()
        parent.wait()
        return _gone_within(started, NO_HANG_TIMEOUT)
    finally:
        parent.kill()
        parent.wait()
        _kill_all(started)


def test_when_the_wrappers_parent_dies_the_command_gets_sigterm_and_everything_exits(tmp_path):
    alive = _orphan_wrapper(tmp_path, "record")

    assert not alive, "wrapper or command outlived the wrapper's parent"
    assert (tmp_path / "sigterm").exists(), "the command was not given SIGTERM to stop cleanly"


def test_an_orphaned_command_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    alive = _orphan_wrapper(tmp_path, "ignore", grace_s=1)

    assert not alive, "a command ignoring SIGTERM outlived its orphaned wrapper"


def test_an_orphaned_wrapper_stuck_writing_to_a_full_pipe_exits_after_the_grace_period(tmp_path):
    """Its parent gone, the wrapper blocks writing output nobody reads (the pipe's other end is held, here
    by this test): the command is stopped, and the wrapper itself must not stay behind either."""
    held, write_end = os.pipe()
    try:
        alive = _orphan_wrapper(tmp_path, "flood", stderr=write_end, grace_s=1)
    finally:
        os.close(write_end)
        os.close(held)

    assert not alive, "a wrapper blocked on its output outlived its parent"


SIGNAL_STORM = """
import signal, sys, time
from hvdazure.launch.rank_wrapper import _SignalForwarder
forward = _SignalForwarder()
signal.signal(signal.SIGUSR1, forward)
print("ready", flush=True)
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    forward.signals.clear()
    forward.wait(0.0005)
print("done", flush=True)
"""


def test_a_signal_arriving_in_any_instant_of_a_wait_for_it_is_handled(tmp_path):
    """Signals at random instants of the wrapper's waits for one (a handler that took a lock the waiting
    main thread held would wait for itself forever); the waits must keep ending."""
    waiter = subprocess.Popen([sys.executable, "-c", SIGNAL_STORM, "3"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        assert waiter.stdout.readline() == "ready\n"
        sent = 0
        while waiter.poll() is None and sent < 600:
            waiter.send_signal(signal.SIGUSR1)
            sent += 1
            time.sleep(0.003)
        output, _ = waiter.communicate(timeout=NO_HANG_TIMEOUT)
    finally:
        waiter.kill()

    assert waiter.returncode == 0 and output.endswith("done\n"), (sent, output[-2000:])


@pytest.fixture
def restore_signal_handlers():
    saved = {sig: signal.getsignal(sig) for sig in rank_wrapper.FORWARDED_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_signals_are_forwarded_from_before_the_command_starts(monkeypatch, capsys, restore_signal_handlers):
    """A signal arriving while the command is being started must not kill the wrapper and orphan it."""
    handlers_at_start = {}

    def popen_spy(*args, **kwargs):
        handlers_at_start.update({sig: signal.getsignal(sig) for sig in rank_wrapper.FORWARDED_SIGNALS})
        raise OSError(2, "not started by this test")

    monkeypatch.setattr(subprocess, "Popen", popen_spy)
    assert rank_wrapper.main(["--", "true"]) == 127
    assert handlers_at_start
    for sig, handler in handlers_at_start.items():
        assert callable(handler) and handler is not signal.default_int_handler, sig.name
    assert "rank 0 failed with exit code 127 (cannot start 'true'" in capsys.readouterr().err


def test_a_rank_says_where_it_started_and_that_it_exited(capfd, restore_signal_handlers):
    assert rank_wrapper.main(["--", sys.executable, "-c", "pass"]) == 0

    assert capfd.readouterr().err.splitlines() == [
        f"hvdazure: rank 0 started on {socket.gethostname()}", "hvdazure: rank 0 exited with code 0"]


def test_a_gloo_timeout_is_reported_as_a_root_cause_naming_the_network_and_the_setting(
        capfd, restore_signal_handlers):
    says_timeout = "import sys; print('gloo: Timed out waiting 30000ms for recv operation to complete', " \
                   "file=sys.stderr); print('HorovodInternalError', file=sys.stderr); sys.exit(1)"
    assert rank_wrapper.main(["--", sys.executable, "-c", says_timeout]) == 1

    failure = RankFailure.parse(capfd.readouterr().err.splitlines()[-1])
    assert failure is not None and not failure.follow_on
    assert failure.detail.startswith(" (timed out waiting for another rank: the network between nodes")
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS" in failure.detail
