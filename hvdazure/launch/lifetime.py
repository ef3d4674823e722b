"""Keeping a job's processes from outliving the process that started them (Linux; no-ops elsewhere).

Signal handlers cannot help a process that is killed outright (SIGKILL, the OOM killer): its children
simply carry on. Linux offers two mechanisms that need no cooperation from the dying process:

- the parent-death signal (prctl PR_SET_PDEATHSIG): the kernel signals a process when its parent dies.
  It fires when the *thread* that forked the process exits, so only fork from a long-lived thread (the
  main thread, here);
- the child subreaper (prctl PR_SET_CHILD_SUBREAPER): orphaned descendants are re-parented to the
  subreaper instead of to init, so it can still find and stop them.

- the launcher's identity (`process_identity`: machine boot, pid, start time) in the ranks' environment
  (LAUNCHER_ENV), which each rank's wrapper watches: the ranks on the launcher's machine stop when it is
  gone, whatever became of the processes between (horovodrun and its per-rank middlemen stop the ranks
  only if they themselves are told and able to).

Elsewhere these functions do nothing and say so by returning False; the launcher's signal handlers and
its sweep of child processes still apply.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def _prctl(option: int, arg: int) -> bool:
    """Call prctl(2); False where there is none (not Linux) or it failed."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes  # here: only Linux needs it, and the rank wrapper's start-up stays short

    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) == 0


def die_with_parent(signum: int) -> bool:
    """Have the kernel send `signum` to this process when its parent dies; True if it will."""
    return _prctl(_PR_SET_PDEATHSIG, signum)


def die_with_this_process(signum: int) -> Callable[[], None]:
    """A `preexec_fn` for subprocess.Popen: the child gets `signum` when this process dies.

    Call Popen from the main thread: the signal fires when the forking thread exits."""
    parent = os.getpid()

    def in_child() -> None:
        if die_with_parent(signum) and os.getppid() != parent:
            os.kill(os.getpid(), signum)  # the parent died before prctl took effect

    return in_child


def is_child_subreaper() -> bool:
    """Whether orphaned descendants of this process are re-parented to it."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    flag = ctypes.c_int(0)
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value != 0


def set_child_subreaper(enabled: bool) -> bool:
    """Make this process (or stop it being) the subreaper of its descendants; True if that took effect."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, int(enabled))


LAUNCHER_ENV = "HVDAZURE_LAUNCHER_PROCESS"  # `hvdazure run`'s process_identity(), for the rank wrappers


def _machine() -> str | None:
    """This machine's boot and pid namespace ("BOOT_ID/PIDNS"): where a pid means the same process."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, str] | None:
    """Process `pid`'s state letter and start time (fields 3 and 22 of /proc/PID/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            fields = file.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
        return fields[0], fields[19]
    except (OSError, IndexError):
        return None


def process_identity(pid: int | None = None) -> str | None:
    """"MACHINE:PID:START" for process `pid` (default: this one): unique across machines, boots and pid
    namespaces (containers), and a pid reused later has another start time; None where /proc does not
    tell (not Linux, or no such process)."""
    pid = os.getpid() if pid is None else pid
    machine, stat = _machine(), _stat(pid)
    return f"{machine}:{pid}:{stat[1]}" if machine and stat else None


def process_gone(identity: str) -> bool:
    """Whether the process `identity` names has ended (a zombie has): only where its pid means the same
    process (another machine's or container's process, or an identity that does not parse, is never taken
    for gone)."""
    machine, _, rest = identity.partition(":")
    pid, _, start = rest.partition(":")
    if not pid.isdigit() or machine != _machine():
        return False
    stat = _stat(int(pid))
    return stat is None or stat[1] != start or stat[0] in "ZX"
