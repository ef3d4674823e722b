"""The stack dumps' faulthandler path (hvdazure/launch/stack_dumps.py) on plain processes: a process that
imported hvdazure under a stacks folder writes its own stacks when asked, and one that did not is never
sent the dump signal (a real-time signal ends a process that does not handle it)."""

import os
import subprocess
import sys
import time

import psutil
import pytest

from hvdazure.launch.stack_dumps import PY_SPY_ENV, STACKS_DIR_ENV, dump_stacks

WAITS = """
import threading
import hvdazure

def waits_on_a_lock():
    lock = threading.Lock()
    lock.acquire()
    print("waiting", flush=True)
    lock.acquire()

waits_on_a_lock()
"""


@pytest.fixture
def without_py_spy(monkeypatch):
    monkeypatch.setenv(PY_SPY_ENV, "")


def test_a_process_that_imported_hvdazure_writes_its_python_stacks_on_the_dump_signal(tmp_path,
                                                                                     without_py_spy):
    proc = subprocess.Popen([sys.executable, "-c", WAITS], env={**os.environ, STACKS_DIR_ENV: str(tmp_path)},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "waiting\n"
        stacks = dump_stacks([psutil.Process(proc.pid)], str(tmp_path))
    finally:
        proc.kill()
        proc.wait()

    assert f"--- process {proc.pid} (parent " in stacks
    assert "(Python's faulthandler: Python frames only)" in stacks
    assert ' in waits_on_a_lock\n' in stacks, stacks


def test_a_process_that_did_not_register_is_not_signalled_even_beside_a_file_of_its_pid(tmp_path,
                                                                                        without_py_spy):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f"{sleeper.pid}.stacks").write_text("")  # left by an earlier process of the same pid
        stacks = dump_stacks([psutil.Process(sleeper.pid)], str(tmp_path))
        time.sleep(0.2)
        assert sleeper.poll() is None, "the dump signal ended a process that does not handle it"
    finally:
        sleeper.kill()
        sleeper.wait()

    assert "(no stacks: no py-spy, and the process registered no faulthandler)" in stacks
