"""Runs a launcher process (mpirun/horovodrun), streams rank-tagged output, and stops the whole job promptly.

A job ends when the launcher exits. Three things end it early, each by stopping every rank: a rank reporting
failure (ranks left waiting in a collective would otherwise hang), the --timeout, and SIGINT, SIGTERM or
SIGHUP (a closed terminal) to `hvdazure run` itself. Stopping sends SIGTERM to the ranks first and gives
them a grace period to save a checkpoint (the launcher is left alone meanwhile: horovodrun would kill them
after 5 s), then SIGTERM to the launcher and what is left, then SIGKILL.

No process of the job outlives `hvdazure run`: the signal handlers are in place before the launcher
starts; the launcher gets SIGTERM from the kernel if `hvdazure run` is killed outright (SIGKILL, the OOM
killer), and tears its ranks down; `hvdazure run` is the subreaper of its descendants, so a rank whose
parent died is re-parented to it rather than lost; and whatever is left when the launcher exits, however
it exits, is stopped (see launch/lifetime.py).

What users read: on several nodes, which interface their ranks talk over (launch/network.py); rank output
as it comes, rank 0's as a 1-process run prints it and another rank's marked `[rank N] `, with rank 0's
progress display redrawn in place on a terminal (launch/console.py; the launchers' tags are read here, to
route and attribute each line, and never shown), except that a Python traceback is shown whole and an
error once, not once per rank (launch/tracebacks.py; `verbose` shows every traceback in full); the
launcher's own lines
until a rank fails or the job is being stopped (after that they repeat what the summary says, with a
traceback: `verbose` keeps them); and one summary line. It names the rank that failed first (and its host,
on several) and the ranks that failed with the same error, or a node none of whose ranks said how they
ended (each rank's wrapper says where it started and how it ended, in lines read here and not shown): that
node, or the network to it, went down. Every line is also written to a log file, kept and named when some
traceback was not shown in full. With --timeline, a successful job's last line says where Horovod's
timeline is (launch/timeline.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import psutil

from hvdazure.core.progress_display import TERMINAL_ENV
from hvdazure.launch.command import LaunchSpec, build_command, is_rank_wrapper_command
from hvdazure.launch.console import Console, Segments, is_redraw, rank_prefix
from hvdazure.launch.controller import default_controller
from hvdazure.launch.exit_status import (
    RankFailure,
    exit_code_of,
    lost_node,
    parse_exited,
    parse_started,
    with_time_since_start,
)
from hvdazure.launch.lifetime import (
    LAUNCHER_ENV,
    die_with_this_process,
    is_child_subreaper,
    process_identity,
    set_child_subreaper,
)
from hvdazure.launch.network import CrossNodeInterface, choose_interface, host_names, this_machine
from hvdazure.launch.rank_wrapper import GRACE_ENV
from hvdazure.launch.stack_dumps import dump_stacks, stacks_folder
from hvdazure.launch.timeline import TimelineStamp
from hvdazure.launch.tracebacks import Tracebacks

TIMEOUT_EXIT_CODE = 124  # as coreutils' timeout(1)
# What stops `hvdazure run` and so the whole job: Ctrl-C, kill, the terminal closing. A rank stops on
# fewer (core/stop_signals.py's RANK_STOP_SIGNALS): it has no terminal.
SUPERVISOR_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_LAUNCHER_GRACE_S = 5.0
_CHUNK_BYTES = 65536  # read from the launcher's output at most at a time
_TRACEBACK_POLL_S = 0.25  # how often tracebacks held past their hold time are looked for
_MPI_TAG = re.compile(r"^\[\d+,(\d+)\]<(stdout|stderr)>:")
_HOROVODRUN_TAG = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:")
# horovodrun imports TensorFlow, whose start-up log lines (absl format, INFO or WARNING) say nothing about
# the job: e.g. "I0000 00:00:1796022491.280376   16565 port.cc:153] oneDNN custom operations are on."
_LAUNCHER_IMPORT_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|[IW]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] )")


@dataclass(frozen=True)
class JobResult:
    """How a job ended: its exit code, the first rank that failed (if any), and whether it timed out."""

    exit_code: int
    failed_rank: int | None
    timed_out: bool
    duration_s: float


def normalize_line(line: str) -> tuple[str, bool]:
    """Rewrite mpirun's `[job,rank]<stream>:` tag to horovodrun's `[rank]<stream>:`; say if it is stderr.
    mpirun tags each 4 KB it reads from a rank: a line that straddled two reads (a traceback comes in a
    burst) carries its tag again inside, which is taken out."""
    match = _MPI_TAG.match(line)
    if match:
        line = f"[{match.group(1)}]<{match.group(2)}>:{line[match.end():].replace(match.group(0), '')}"
    match = _HOROVODRUN_TAG.match(line)
    return line, bool(match and match.group(2) == "stderr")


class _Job:
    """One launcher process and everything it started, orphans re-parented to this process included."""

    def __init__(self, verbose: bool = False) -> None:
        self.proc: subprocess.Popen | None = None
        self.verbose = verbose
        self.started_at = time.time()  # wall clock: rank failure lines carry wall-clock times
        self.failures: list[RankFailure] = []
        self.hosts: dict[int, str] = {}  # rank -> the host it started on, from each rank's started line
        self.exited: set[int] = set()  # ranks that said how they ended (failed or not)
        self.failed_at: float | None = None  # when the first failure line arrived (monotonic clock)
        self.stop_requested = threading.Event()
        self.stopped_by_signal: int | None = None  # the first stop signal `hvdazure run` received
        self.stopping = False  # we stop the job: the launcher's complaints about it are noise
        self.tracebacks = Tracebacks(verbose)
        self.console = Console(terminal=False)  # run_job's says whether its stderr is a terminal
        self.output_ended = threading.Event()
        self._output_lock = threading.Lock()  # the output pump and the traceback poll both write
        self._log: TextIO | None = None  # every line of the output (opened by start)
        self._log_path = Path()
        self.stacks_dir: str | None = None  # where the job's processes register faulthandler (stack_dumps.py)
        self.stacks_log: Path | None = None  # the log that holds their stacks, once the timeout dumped them
        # Children this process had before the job are not the job's (when run_job is called as a library).
        self._not_ours = {p.pid for p in psutil.Process().children(recursive=True)}

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        """Start the launcher in its own session (the terminal's Ctrl-C reaches `hvdazure run` alone, which
        stops the ranks in order); the kernel sends it SIGTERM if this process dies without doing so."""
        self.proc = subprocess.Popen(
            list(argv), env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=die_with_this_process(signal.SIGTERM),
        )
        with contextlib.suppress(OSError):  # no log where no temporary file can be made: -v still shows all
            fd, path = tempfile.mkstemp(prefix="hvdazure-run-", suffix=".log")
            self._log, self._log_path = open(fd, "w", errors="replace"), Path(path)  # noqa: SIM115

    def on_signal(self, signum: int, _frame: object) -> None:
        if self.stopped_by_signal is None:
            self.stopped_by_signal = signum
        self.stop_requested.set()

    def pump_output(self, out: TextIO, err: TextIO) -> None:
        try:
            for raw in self._segments():
                line, is_err = normalize_line(raw)
                with self._output_lock:
                    self._take(line, is_err, out, err)
        finally:
            with self._output_lock:
                self.console.write(err, self.tracebacks.release_all())
                self.console.close()
            self.output_ended.set()

    def _segments(self) -> Iterator[str]:
        """The launcher's output a segment (a line, or a redraw: launch/console.py) at a time, as it comes.
        mpirun tags a chunk of a rank's output, not each segment in it: what follows a redraw in the same
        chunk gets the redraw's tag."""
        assert self.proc is not None and self.proc.stdout is not None
        segments, open_tag = Segments(), ""
        while True:
            chunk = self.proc.stdout.read1(_CHUNK_BYTES)  # type: ignore[attr-defined]  # a BufferedReader
            for piece in segments.feed(chunk) if chunk else segments.end():
                text = piece.decode(errors="replace")
                if open_tag and not _MPI_TAG.match(text):
                    text = open_tag + text
                tag = _MPI_TAG.match(text)
                open_tag = tag.group(0) if tag is not None and is_redraw(text) else ""
                yield text
            if not chunk:
                return

    def _take(self, line: str, is_err: bool, out: TextIO, err: TextIO) -> None:
        """Log one segment of the launcher's output and show what of it is shown now."""
        tag = _HOROVODRUN_TAG.match(line)
        failure = RankFailure.parse(line) if tag else None
        if failure is not None:
            line = with_time_since_start(line, self.started_at)
        redraw = tag is not None and is_redraw(line)
        if self._log is not None and not redraw:  # the log keeps the launchers' tags, and no redraws
            self._log.write(line)
        if tag is None:
            if self._shows_launcher_line(line):
                self.console.write(out, [line])
            return
        rank, text, stream = int(tag.group(1)), line[tag.end():], err if is_err else out
        if redraw:
            self.console.redraw(rank, stream, text[:-1])
            return
        text = text[:-2] + "\n" if text.endswith("\r\n") else text
        if self._note_start_or_exit(line):
            self.console.write(err, self.tracebacks.rank_ended(rank))
        elif failure is not None:
            self._record(failure)
            self.console.write(err, [*self.tracebacks.rank_ended(rank), rank_prefix(rank) + text])
        elif self.console.line_ends(rank, stream, text):
            return  # it ended a line this rank was redrawing, as it last was
        elif is_err:
            now = time.monotonic()
            self.console.write(err, self.tracebacks.stderr_line(rank, rank_prefix(rank), text, now))
        else:
            self.console.write(out, [rank_prefix(rank) + text])

    def show_tracebacks_held_too_long(self, err: TextIO) -> None:
        """Until the output ends, show each traceback whose next line is overdue: its rank goes on, or is
        slow to exit."""
        while not self.output_ended.wait(_TRACEBACK_POLL_S):
            with self._output_lock:
                self.console.write(err, self.tracebacks.stale(time.monotonic()))

    def log_stacks(self, err: TextIO) -> None:
        """The stacks of every process of the job, into the log (on `err` if there is none): where a job
        that timed out hung (launch/stack_dumps.py)."""
        stacks = dump_stacks(self.processes(), self.stacks_dir)  # seconds: the output goes on meanwhile
        with self._output_lock:
            if self._log is None:
                _write(err, [stacks])
                return
            self._log.write(stacks)
            self.stacks_log = self._log_path

    def close_log(self) -> Path | None:
        """Close the log: kept, and its path returned, when a traceback was not shown in full or it holds
        the stacks; else removed."""
        if self._log is None:
            return None
        self._log.close()
        if self.tracebacks.not_in_full or self.stacks_log is not None:
            return self._log_path
        self._log_path.unlink(missing_ok=True)
        return None

    def _shows_launcher_line(self, line: str) -> bool:
        """The launcher's own output is shown until a rank fails or the job is being stopped: after that it
        reports what the summary says (horovodrun with a 20-line traceback)."""
        if self.verbose:
            return True
        return not (self.stopping or self.failures or _LAUNCHER_IMPORT_NOISE.match(line))

    def _note_start_or_exit(self, line: str) -> bool:
        """Record a rank's started or exited line (not shown to users); say whether it was one."""
        started = parse_started(line)
        if started is not None:
            self.hosts[started[0]] = started[1]
            return True
        exited = parse_exited(line)
        if exited is not None:
            self.exited.add(exited)
            return True
        return False

    def _record(self, failure: RankFailure) -> None:
        self.failures.append(failure)
        self.exited.add(failure.rank)
        if self.failed_at is None:
            self.failed_at = time.monotonic()
            self.stop_requested.set()

    def processes(self) -> list[psutil.Process]:
        """Every process of the job still there: the launcher, its descendants, and orphans adopted."""
        return [p for p in psutil.Process().children(recursive=True) if p.pid not in self._not_ours]

    def stop(self, grace_s: float) -> None:
        """Stop every local process of the job; ranks get `grace_s` seconds after SIGTERM."""
        self.stopping = True
        self.end_leftovers(grace_s)

    def end_leftovers(self, grace_s: float) -> None:
        """SIGTERM the ranks, wait up to `grace_s`, then SIGTERM everything else, then SIGKILL."""
        ranks = [p for p in self.processes() if _is_rank_wrapper(p)]
        _signal_all(ranks, signal.SIGTERM)
        psutil.wait_procs(ranks, timeout=grace_s)
        procs = self.processes()
        _signal_all(procs, signal.SIGTERM)
        _, alive = psutil.wait_procs(procs, timeout=_LAUNCHER_GRACE_S)
        _signal_all(alive, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=_LAUNCHER_GRACE_S)  # reaps the adopted ones


def _write(stream: TextIO, lines: Sequence[str]) -> None:
    if lines:
        stream.write("".join(lines))
        stream.flush()


def _is_rank_wrapper(proc: psutil.Process) -> bool:
    try:
        return is_rank_wrapper_command(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _signal_all(procs: Sequence[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(sig)


@contextlib.contextmanager
def _stop_signals_caught(handler: Callable[[int, object], None]) -> Iterator[None]:
    """Within the block, SUPERVISOR_STOP_SIGNALS call `handler` (main thread only: Python's rule for
    handlers)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, handler) for sig in SUPERVISOR_STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def _orphans_adopted() -> Iterator[None]:
    """Within the block, descendants whose parent dies are re-parented to this process (Linux)."""
    was_subreaper = is_child_subreaper()
    set_child_subreaper(True)
    try:
        yield
    finally:
        if not was_subreaper:
            set_child_subreaper(False)


def run_job(
    spec: LaunchSpec,
    timeout_s: float | None = None,
    grace_s: float = 30.0,
    failure_grace_s: float = 3.0,
    out: TextIO | None = None,
    err: TextIO | None = None,
    env: Mapping[str, str] | None = None,
    verbose: bool = False,
) -> JobResult:
    """Run a job to completion and return how it ended; never leaves ranks running behind.

    `grace_s`: how long ranks may take to exit after SIGTERM on a timeout or a signal (a final checkpoint).
    `failure_grace_s`: after a rank failed, how long the launcher gets to stop the others by itself, and
    then how long they get after SIGTERM (they cannot save anything useful with a peer gone).
    `verbose`: show the launcher's own output after a failure too (horovodrun's traceback, mpirun's report).
    Every process this process starts while the job runs is treated as part of the job."""
    out, err = out or sys.stdout, err or sys.stderr
    interface = cross_node_interface(spec, env)
    if spec.controller is None:  # checked what can be checked first: this asks mpirun and ldd
        spec = dataclasses.replace(spec, controller=default_controller())
    if interface is not None:
        err.write(_interface_line(spec, interface))
    columns = terminal_columns(err)
    argv, job_env = build_command(spec, with_terminal(os.environ if env is None else env, columns), interface)
    job_env[GRACE_ENV] = f"{grace_s:g}"  # ranks whose launcher dies stop within the same grace
    if (identity := process_identity()) is not None:  # the rank wrappers watch this process itself
        job_env[LAUNCHER_ENV] = identity
    timeline = TimelineStamp.of(spec.timeline) if spec.timeline is not None else None
    start = time.monotonic()
    job = _Job(verbose)
    job.console = Console(terminal=columns is not None)
    pump = threading.Thread(target=job.pump_output, args=(out, err), daemon=True)
    poll = threading.Thread(target=job.show_tracebacks_held_too_long, args=(err,), daemon=True)
    timed_out = False
    with _stop_signals_caught(job.on_signal), _orphans_adopted(), stacks_folder(job_env) as job.stacks_dir:
        try:
            job.start(argv, job_env)
            pump.start()
            poll.start()
            timed_out = _supervise(job, start, timeout_s, grace_s, failure_grace_s, err)
        finally:
            if job.proc is not None and job.proc.poll() is None:
                job.stop(grace_s)  # an exception: nothing may be left running
            job.end_leftovers(grace_s)  # ranks or their children the launcher left behind
    if pump.ident is not None:  # started
        pump.join(timeout=5)
    job.output_ended.set()  # the poll's end, even if the pump is stuck
    if poll.ident is not None:
        poll.join(timeout=5)
    log = job.close_log()
    if log is not None and job.tracebacks.not_in_full:  # a log kept for the stacks: the timeout names it
        err.write(f"hvdazure run: {_tracebacks(job.tracebacks.not_in_full)} not shown in full; every rank's "
                  f"output is in {log} (--verbose shows it all here)\n")
    result = _report(job, timed_out, timeout_s, time.monotonic() - start, err)
    if timeline is not None and result.exit_code == 0:
        err.write(timeline.report_line())
    return result


def terminal_columns(stream: TextIO) -> int | None:
    """The width of the terminal `stream` writes to (where rank 0's progress display is drawn), or None
    when it is no terminal."""
    try:
        return os.get_terminal_size(stream.fileno()).columns if stream.isatty() else None
    except (AttributeError, OSError, ValueError):  # no file descriptor (a StringIO), or no size
        return None


def with_terminal(env: Mapping[str, str], columns: int | None) -> dict[str, str]:
    """The ranks' environment: with TERMINAL_ENV, the width rank 0 draws its progress display in, when
    `hvdazure run` writes to a terminal; without it otherwise (not even one inherited from outside)."""
    env = {name: value for name, value in env.items() if name != TERMINAL_ENV}
    if columns is not None:
        env[TERMINAL_ENV] = str(columns)
    return env


def _tracebacks(count: int) -> str:
    return "1 traceback" if count == 1 else f"{count} tracebacks"


def cross_node_interface(spec: LaunchSpec, env: Mapping[str, str] | None = None) -> CrossNodeInterface | None:
    """The interface ranks on different nodes talk over (launch/network.py); NetworkInterfaceError if
    --network-interface names none here."""
    hosts = host_names(spec.hosts, spec.hostfile)
    return choose_interface(spec.network_interface, hosts, os.environ if env is None else env, this_machine())


def _interface_line(spec: LaunchSpec, interface: CrossNodeInterface) -> str:
    if spec.controller == "mpi":
        setting = f"mpirun -mca btl_tcp_if_include/oob_tcp_if_include {interface.mpi_include}"
    else:
        setting = f"horovodrun --network-interfaces {interface.name}"
    return f"hvdazure run: ranks on different nodes talk over {interface.name} ({interface.why}): {setting}\n"


def _supervise(job: _Job, start: float, timeout_s: float | None, grace_s: float,
               failure_grace_s: float, err: TextIO) -> bool:
    """Wait for the launcher to exit, stopping the job early on a failure, a signal or the timeout (after
    logging every process's stacks, to show where it hung). Returns whether the timeout stopped it."""
    assert job.proc is not None
    while job.proc.poll() is None:
        if job.stop_requested.wait(0.1):
            # Give the launcher a moment to tear down by itself after a rank failure (mpirun does), then
            # stop everything: survivors blocked in a collective would wait forever.
            if job.failed_at is not None:
                remaining = failure_grace_s - (time.monotonic() - job.failed_at)
                if remaining > 0 and _exits_within(job.proc, remaining):
                    return False
            job.stop(grace_s if job.failed_at is None else failure_grace_s)
            return False
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            job.log_stacks(err)
            job.stop(grace_s)
            return True
    return False


def _report(job: _Job, timed_out: bool, timeout_s: float | None, duration: float, err: TextIO) -> JobResult:
    """Say in one line how the job ended, and return it as a JobResult."""
    assert job.proc is not None
    if timed_out:
        stacks = f" (where it hung: each process's stacks are in {job.stacks_log})" if job.stacks_log else ""
        err.write(f"hvdazure run: job exceeded --timeout {timeout_s:g}s; stopped all ranks{stacks}\n")
        return JobResult(TIMEOUT_EXIT_CODE, None, True, duration)
    if job.stopped_by_signal is not None:
        name = signal.Signals(job.stopped_by_signal).name
        err.write(f"hvdazure run: received {name}; stopped all ranks\n")
        return JobResult(128 + job.stopped_by_signal, None, False, duration)
    code, detail = exit_code_of(job.proc.wait())
    # A node whose ranks all vanished without a word explains the failure better than peers' follow-ons.
    lost = lost_node(job.hosts, job.exited, here=socket.gethostname())
    if lost is not None and code != 0 and all(failure.follow_on for failure in job.failures):
        host, ranks = lost
        listed = ", ".join(map(str, ranks))
        err.write(f"hvdazure run: rank {ranks[0]} on {host} failed first: {host} was lost (none of its "
                  f"ranks, {listed}, said how it ended: the node, or the network to it, went down); stopped "
                  f"all ranks ({duration:.1f}s after start)\n")
        return JobResult(code, ranks[0], False, duration)
    if job.failures:
        first = min(job.failures)  # the root cause: not a follow-on failure, and earliest
        err.write(f"hvdazure run: rank {first.rank}{_on_host(job, first.rank)} failed first, with exit code "
                  f"{first.code}{first.detail}{_same_error(job, first.rank)}; stopped all ranks "
                  f"({duration:.1f}s after start)\n")
        return JobResult(first.code, first.rank, False, duration)
    if code != 0:
        err.write(f"hvdazure run: launcher exited with code {code}{detail}\n")
    return JobResult(code, None, False, duration)


def _same_error(job: _Job, rank: int) -> str:
    """"; ranks 0, 2 failed with the same error", and whose traceback shows it when not `rank`'s."""
    failed = {failure.rank for failure in job.failures}
    same = [r for r in job.tracebacks.same_error_as(rank) if r in failed or r not in job.exited]
    if not same:
        return ""
    shown_by = job.tracebacks.shown_by(rank)
    shown = f" (rank {shown_by}'s traceback is the one shown)" if shown_by not in (None, rank) else ""
    ranks = f"rank{'s' if len(same) > 1 else ''} {', '.join(map(str, same))}"
    return f"; {ranks} failed with the same error{shown}"


def _on_host(job: _Job, rank: int) -> str:
    """" on HOST" when the job ran on several hosts (on one, naming it says nothing)."""
    return f" on {job.hosts[rank]}" if len(set(job.hosts.values())) > 1 and rank in job.hosts else ""


def _exits_within(proc: subprocess.Popen, seconds: float) -> bool:
    """Whether `proc` exits within `seconds` (it is waited for that long at most)."""
    try:
        proc.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False

