"""The one way the benchmarks start processes of their own (hvdazure/bench/processes.py): exit codes in
order, output in the logs, the wait ending when the last process exits, and no process left behind after a
timeout or an interrupted wait, each failure one line naming the command."""

import os
import sys
import time

import pytest

from hvdazure.bench import processes
from hvdazure.bench.benchmark import BenchError

PY = sys.executable


def command(tmp_path, code, name="p"):
    return processes.Command([PY, "-c", code], dict(os.environ), tmp_path / f"{name}.log")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie waiting for its parent counts as gone
        return stat.read().split(")")[-1].split()[0] != "Z"


SPAWNS_AND_SLEEPS = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
time.sleep(60)
"""


def test_every_command_runs_at_once_and_its_exit_code_and_output_come_back_in_order(tmp_path):
    commands = [command(tmp_path, "import sys; print('first'); sys.exit(3)", "a"),
                command(tmp_path, "print('second')", "b")]
    start = time.perf_counter()
    assert processes.run_together(commands, 30.0, "test") == [3, 0]
    assert time.perf_counter() - start < 5  # no timeout waited out
    assert commands[0].last_lines(1) == ["first"] and commands[1].last_lines(1) == ["second"]


def test_a_timeout_stops_the_whole_process_group_and_names_the_command(tmp_path):
    spawner = command(tmp_path, SPAWNS_AND_SLEEPS)
    with pytest.raises(BenchError) as error:
        processes.run_together([spawner], 1.0, "bench: run 1")
    message = str(error.value)
    assert message.startswith("bench: run 1: `") and "still ran after --timeout 1 s" in message
    assert "\n" not in message
    grandchild = int(spawner.last_lines(1)[0])
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)


def test_an_interrupted_wait_stops_what_it_started(tmp_path, monkeypatch):
    spawner = command(tmp_path, SPAWNS_AND_SLEEPS)

    def interrupted(proc, deadline):
        while not spawner.last_lines(1):  # the grandchild has started
            time.sleep(0.02)
        raise KeyboardInterrupt

    monkeypatch.setattr(processes, "_exited_by", interrupted)
    with pytest.raises(KeyboardInterrupt):
        processes.run_together([spawner], None, "test")
    grandchild = int(spawner.last_lines(1)[0])
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)


def test_a_program_that_is_not_there_is_one_line_naming_it(tmp_path):
    missing = processes.Command(["/no/such/launcher", "-np", "2"], {}, tmp_path / "x.log")
    with pytest.raises(BenchError, match=r"^launch: cannot start `/no/such/launcher -np 2`: .*No such file"):
        processes.run_together([missing], 10.0, "launch")
