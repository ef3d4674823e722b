"""Where a hung job is stuck: the stacks of every process of a job, taken before it is stopped.

`hvdazure run --timeout` writes them into the run's log file (launch/supervisor.py), and the test harness
into its "job hung" failure (tests/distributed/harness.py): the ranks, their DataLoader workers, the rank
wrappers and the launcher, each with its command line and state. Two ways to read a process's stacks:

- py-spy (`py-spy dump --native --pid P`): every thread's Python frames and the native (C/C++) frames
  between them (a futex wait inside a lock, an MPI progress loop), read from outside through ptrace. It
  needs nothing from the process, but ptrace must be allowed: root or CAP_SYS_PTRACE (a container started
  without it, as most are, refuses). The executable is HVDAZURE_PY_SPY if set (empty: do not use py-spy),
  else the one beside this Python, else the one on PATH.
- faulthandler: every process of the job that imports hvdazure (ranks, rank wrappers, DataLoader workers
  however they start) registers Python's faulthandler on DUMP_SIGNAL at import, writing into a file of its
  own, <pid>.stacks in the job's stacks folder (STACKS_DIR_ENV, set by `hvdazure run`); a forked child opens
  its own (os.register_at_fork). Python frames only, but it needs no ptrace, and it answers even while the
  process is blocked in C code: the handler runs in C, without the interpreter lock.

py-spy is tried first; where it is missing or cannot attach, the process's faulthandler file is read. A
process with neither (mpirun, orted) is listed with its command line and state alone. Both show Python
threads only: each process's header also says where in the kernel each of its threads waits (Linux's
/proc/PID/task/TID/wchan), Horovod's background thread and MPI's among them (`futex_do_wait` or
`futex_wait_queue`: a lock or a condition; `do_epoll_wait`, `poll_schedule_timeout`: an event loop;
`hrtimer_nanosleep`: a sleep). Processes on other nodes are not reached: each node's are its own.

This module imports only the standard library at the top: `import hvdazure` calls
`register_from_environment` in every process.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, MutableMapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

STACKS_DIR_ENV = "HVDAZURE_STACKS_DIR"  # the job's stacks folder: set by `hvdazure run` for every rank
PY_SPY_ENV = "HVDAZURE_PY_SPY"  # the py-spy executable; empty: faulthandler only
# A real-time signal: unused by Python, MPI and the launchers, and not one a user's script handles
# (SIGUSR1/SIGUSR2 are, and the rank wrapper forwards those to the rank).
DUMP_SIGNAL = signal.SIGRTMIN + 3
_PY_SPY_TIMEOUT_S = 20.0  # for all the processes together (they are read in parallel)
_FAULTHANDLER_WAIT_S = 3.0  # for the signalled processes to finish writing
_SETTLED_S = 0.3  # a file that has not grown for this long is complete
_COMMAND_CHARS = 300

_registered: IO[str] | None = None  # this process's faulthandler file, kept open


# --- in every process of the job ---------------------------------------------------------------------------
def register_from_environment() -> None:
    """Where `hvdazure run` set a stacks folder that exists here (not on a node without it), register
    faulthandler on DUMP_SIGNAL into this process's file there, and do the same in every child it forks.
    Never fails: a process that cannot register is read by py-spy, or listed without its stacks."""
    if not os.path.isdir(os.environ.get(STACKS_DIR_ENV, "")):
        return
    if _register() and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_register)


def _register() -> bool:
    global _registered
    folder = os.environ.get(STACKS_DIR_ENV, "")
    try:
        file = open(os.path.join(folder, f"{os.getpid()}.stacks"), "w")  # noqa: SIM115 (kept open)
        faulthandler.register(DUMP_SIGNAL, file=file, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return False
    _registered = file  # a forked child's copy of its parent's file is closed here, its own kept
    return True


# --- in the process that dumps them ------------------------------------------------------------------------
@contextlib.contextmanager
def stacks_folder(env: MutableMapping[str, str]) -> Iterator[str]:
    """The job's stacks folder, set in `env` (a job's environment) for its processes to register in:
    env's own if it names one (the test harness's), else a new temporary folder, removed afterwards."""
    if env.get(STACKS_DIR_ENV):
        yield env[STACKS_DIR_ENV]
        return
    folder = tempfile.mkdtemp(prefix="hvdazure-stacks-")
    env[STACKS_DIR_ENV] = folder
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def py_spy() -> str | None:
    """The py-spy executable to use, or None (HVDAZURE_PY_SPY empty, or none installed)."""
    chosen = os.environ.get(PY_SPY_ENV)
    if chosen is not None:
        return shutil.which(chosen) if chosen else None
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() and os.access(beside, os.X_OK) else shutil.which("py-spy")


def dump_stacks(processes: Sequence[psutil.Process], stacks_dir: str | None = None) -> str:
    """The stacks of `processes` (a job's, parents before children), as text for a log or a failure
    message: one section per process, headed by its pid, parent, state and command line."""
    spy = py_spy()
    count = f"{len(processes)} process{'es' if len(processes) != 1 else ''}"
    header = (f"stacks of the job's {count} on {os.uname().nodename} at "
              f"{time.strftime('%H:%M:%S')}, before they were stopped ("
              f"{'py-spy dump --native' if spy else 'without py-spy'}; Python's faulthandler where "
              "py-spy could not attach):\n")
    stacks = _py_spy_stacks(spy, processes) if spy else {}
    missing = [p for p in processes if p.pid not in stacks or not stacks[p.pid][0]]
    from_faulthandler = _faulthandler_stacks(missing, stacks_dir)
    sections = [header]
    for proc in processes:
        sections.append(_describe(proc))
        if proc.pid in from_faulthandler:
            sections.append(from_faulthandler[proc.pid])
        elif proc.pid in stacks:
            sections.append(stacks[proc.pid][1])
        else:
            sections.append("(no stacks: no py-spy, and the process registered no faulthandler)\n")
    return "".join(section if section.endswith("\n") else section + "\n" for section in sections)


def _describe(proc: psutil.Process) -> str:
    import psutil

    try:
        with proc.oneshot():
            command = " ".join(" ".join(proc.cmdline()).split()) or proc.name()  # on one line
            state, parent = proc.status(), proc.ppid()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return f"--- process {proc.pid}: gone\n"
    if len(command) > _COMMAND_CHARS:
        command = command[:_COMMAND_CHARS] + "..."
    return f"--- process {proc.pid} (parent {parent}), {state}{_threads(proc.pid)}: {command}\n"


def _threads(pid: int) -> str:
    """", 7 threads (in the kernel: futex_do_wait x3, do_epoll_wait, ..., running)": each thread's wait
    channel, or its state where it has none; "" where /proc does not say."""
    waits: Counter[str] = Counter()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, IndexError):
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                wchan = (task / "wchan").read_text().strip()
                wait = "running" if state == "R" else wchan if wchan not in ("", "0") else f"state {state}"
                waits[wait] += 1
    count = sum(waits.values())
    if not count:
        return ""
    listed = ", ".join(wait if n == 1 else f"{wait} x{n}" for wait, n in waits.most_common())
    return f", {count} thread{'s' if count > 1 else ''} (in the kernel: {listed})"


def _py_spy_stacks(spy: str, processes: Sequence[psutil.Process]) -> dict[int, tuple[bool, str]]:
    """pid -> (whether py-spy read it, its dump or the reason it could not), all read in parallel."""
    running = {}
    for proc in processes:
        with contextlib.suppress(OSError):
            running[proc.pid] = subprocess.Popen([spy, "dump", "--native", "--pid", str(proc.pid)],
                                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL, text=True, errors="replace")
    deadline = time.monotonic() + _PY_SPY_TIMEOUT_S
    found = {}
    for pid, dump in running.items():
        try:
            output, _ = dump.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            dump.kill()
            output = dump.communicate()[0]
            found[pid] = (False, f"(py-spy did not answer within {_PY_SPY_TIMEOUT_S:g}s)\n")
            continue
        if dump.returncode == 0:
            found[pid] = (True, _without_py_spy_header(output))
        else:
            # its error's first line (a backtrace of py-spy itself follows): "Error: Failed to find python
            # version from target process" for mpirun, "Permission Denied: ..." without ptrace
            lines = [line for line in output.splitlines() if line.strip()]
            found[pid] = (False, f"(py-spy: {lines[0] if lines else f'exit code {dump.returncode}'})\n")
    return found


def _without_py_spy_header(dump: str) -> str:
    """py-spy's dump without its header lines ("Process P: COMMAND", "Python v3.11.7 (PATH)"): the
    section's header says which process it is."""
    lines = dump.splitlines(keepends=True)
    while lines and (lines[0].startswith(("Process ", "Python v")) or not lines[0].strip()):
        lines.pop(0)
    return "".join(lines)


def _faulthandler_stacks(processes: Sequence[psutil.Process], stacks_dir: str | None) -> dict[int, str]:
    """pid -> the stacks faulthandler wrote on DUMP_SIGNAL, for those of `processes` that registered a file
    in `stacks_dir`."""
    if not stacks_dir:
        return {}
    files = {proc.pid: path for proc in processes
             if _holds_open(proc, path := Path(stacks_dir).resolve() / f"{proc.pid}.stacks")}
    sizes = {}
    for pid, path in files.items():
        with contextlib.suppress(OSError):
            sizes[pid] = path.stat().st_size  # what it wrote before (an earlier dump), left out
            os.kill(pid, DUMP_SIGNAL)
    deadline = time.monotonic() + _FAULTHANDLER_WAIT_S
    previous, unchanged_since = sizes, time.monotonic()
    while time.monotonic() < deadline:  # until every file has grown and none grows any more
        time.sleep(0.05)
        now = {pid: _size(files[pid]) for pid in sizes}
        if now != previous:
            previous, unchanged_since = now, time.monotonic()
        elif all(now[pid] > sizes[pid] for pid in sizes) and time.monotonic() - unchanged_since >= _SETTLED_S:
            break
    found = {}
    for pid, before in sizes.items():
        with contextlib.suppress(OSError), open(files[pid], errors="replace") as file:
            file.seek(before)
            if text := file.read():
                found[pid] = "(Python's faulthandler: Python frames only)\n" + text
    return found


def _holds_open(proc: psutil.Process, path: Path) -> bool:
    """Whether `proc` holds `path` open: it registered faulthandler into it (a file left by an earlier
    process of the same pid does not count: DUMP_SIGNAL would end a process that did not register)."""
    import psutil

    try:
        return path.is_file() and any(Path(f.path) == path for f in proc.open_files())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
