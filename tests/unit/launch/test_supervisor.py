"""`hvdazure run`'s supervisor: a stop signal can never arrive while nothing would stop the job."""

import signal
import subprocess
import sys

import pytest

from hvdazure.core.stop_signals import RANK_STOP_SIGNALS
from hvdazure.launch.command import LaunchSpec
from hvdazure.launch.supervisor import SUPERVISOR_STOP_SIGNALS, run_job

EXPECTED_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, kill, the terminal closing


def test_hvdazure_run_stops_on_ctrl_c_kill_and_the_terminal_closing():
    assert set(SUPERVISOR_STOP_SIGNALS) == set(EXPECTED_STOP_SIGNALS)
    assert set(SUPERVISOR_STOP_SIGNALS) - set(RANK_STOP_SIGNALS) == {signal.SIGHUP}  # ranks have no terminal


def test_stop_signals_are_caught_before_the_launcher_starts_and_restored_after(monkeypatch):
    """Ctrl-C between starting the launcher and catching signals would leave the whole job running."""
    before = {sig: signal.getsignal(sig) for sig in EXPECTED_STOP_SIGNALS}
    at_start = {}

    def popen_spy(*args, **kwargs):
        at_start.update({sig: signal.getsignal(sig) for sig in EXPECTED_STOP_SIGNALS})
        raise OSError(2, "not started by this test")

    monkeypatch.setattr(subprocess, "Popen", popen_spy)
    with pytest.raises(OSError, match="not started by this test"):
        run_job(LaunchSpec(num_proc=2, command=[sys.executable, "-c", "pass"]))

    assert set(at_start) == set(EXPECTED_STOP_SIGNALS)
    for sig, handler in at_start.items():
        assert handler != before[sig], f"{sig.name} not caught when the launcher started"
    assert {sig: signal.getsignal(sig) for sig in EXPECTED_STOP_SIGNALS} == before
