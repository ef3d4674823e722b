"""launch/lifetime.py's process identity, which each rank's wrapper watches to stop its rank when the
`hvdazure run` that started the job is gone (tests/distributed/test_launcher_signals.py for the whole)."""

import subprocess
import sys
import time

import pytest

from hvdazure.launch.lifetime import process_gone, process_identity

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


def test_a_running_process_is_not_gone():
    me = process_identity()
    assert me is not None and not process_gone(me)


def test_a_process_that_ended_is_gone_as_a_zombie_and_once_reaped():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = process_identity(child.pid)
    assert identity is not None
    deadline = time.monotonic() + 30
    while not process_gone(identity) and time.monotonic() < deadline:  # a zombie until it is waited for
        time.sleep(0.05)
    assert process_gone(identity)
    child.wait()
    assert process_gone(identity)


def test_a_reused_pid_is_another_process():
    machine, pid, start = process_identity().split(":")
    assert process_gone(f"{machine}:{pid}:{int(start) + 1}")


@pytest.mark.parametrize("identity", ["another-boot/4026531836:1:5", "garbage", "", "a:b:c"])
def test_a_process_of_another_machine_or_an_identity_that_does_not_parse_is_never_gone(identity):
    assert not process_gone(identity)
