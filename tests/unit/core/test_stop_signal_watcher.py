"""core/stop_signals.py with real signals, in a child process: the first stop signal only asks, copies of
it that arrive together count as one, and a later second one exits at once."""

import signal
import subprocess
import sys
import textwrap

from hvdazure.core.stop_signals import RANK_STOP_SIGNALS

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from hvdazure.core.stop_signals import stop_signals_caught
    asked = []
    with stop_signals_caught(asked.append):
        for delay in map(float, sys.argv[1:]):
            time.sleep(delay)
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.5)  # the watcher thread acts meanwhile, or not
    print("finished, asked", asked, flush=True)
""")


def _run(*delays: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, *map(str, delays)], capture_output=True, text=True,
                          timeout=60)


def test_a_first_sigterm_only_asks_to_stop() -> None:
    proc = _run(0)
    assert proc.returncode == 0, proc.stderr
    assert "finished, asked [15]" in proc.stdout


def test_copies_of_one_sigterm_arriving_together_count_as_one() -> None:
    # was: a launcher and the rank's wrapper both passing one SIGTERM on made the rank exit at once,
    # without the final checkpoint the first SIGTERM asked for
    proc = _run(0, 0)
    assert proc.returncode == 0, proc.stderr
    assert "second SIGTERM" not in proc.stderr


def test_a_later_second_sigterm_exits_at_once_with_143_and_says_so() -> None:
    proc = _run(0, 0.8)
    assert proc.returncode == 143
    assert "second SIGTERM while stopping: exiting now" in proc.stderr
    assert "finished" not in proc.stdout


def test_a_rank_stops_on_sigterm_and_sigint() -> None:
    assert set(RANK_STOP_SIGNALS) == {signal.SIGTERM, signal.SIGINT}
