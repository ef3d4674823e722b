"""Starts real multi-rank jobs through `hvdazure run` and collects what each rank reported.

Workers write one JSON file per rank into a folder the test owns (`report_rank(...)` in workers/_report.py);
the test asserts on those files, the job's exit code and its output, in the parent process.

A job that hangs past its timeout fails the test with the stacks of every process of the job (the ranks,
their DataLoader workers, the launcher: hvdazure/launch/stack_dumps.py), taken before it is killed: a hang
that happens once in a hundred runs says where it happened.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from hvdazure.launch.stack_dumps import STACKS_DIR_ENV, dump_stacks

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
CONTROLLERS = ("gloo", "mpi")
# Where the jobs' processes register Python's faulthandler, read where py-spy cannot attach (one per session)
STACKS_DIR = tempfile.mkdtemp(prefix="hvdazure-test-stacks-")
atexit.register(shutil.rmtree, STACKS_DIR, ignore_errors=True)


@dataclass
class JobRun:
    returncode: int
    stdout: str
    stderr: str
    reports: dict[int, dict]  # rank -> what that rank wrote

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_job(
    script: str | Path,
    *args: str,
    out_dir: Path,
    np: int = 2,
    controller: str = "gloo",
    launcher_args: tuple[str, ...] = (),
    timeout: float = 120,
    env: dict[str, str] | None = None,
) -> JobRun:
    """Run `hvdazure run -np N --<controller> script args` to the end; fail the test if it hangs."""
    script = Path(script)
    if not script.is_absolute():
        script = WORKERS / script
    cmd = [sys.executable, "-m", "hvdazure.cli", "run", "-np", str(np), f"--{controller}", *launcher_args,
           str(script), *args]
    job_env = {**os.environ, "HVDAZURE_TEST_OUT": str(out_dir), STACKS_DIR_ENV: STACKS_DIR, **(env or {})}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=job_env,
                            cwd=REPO)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = stacks_of_tree(proc.pid)
        kill_tree(proc.pid)  # the ranks too: a hung job's ranks would spin on and load the machine
        stdout, stderr = proc.communicate()
        raise AssertionError(f"job hung: {' '.join(cmd)} still running after {timeout}s\n"
                             f"{stdout}\n{stderr}\n{stacks}") from None
    return JobRun(proc.returncode, stdout, stderr, read_reports(out_dir))


def set_args(settings: tuple[str, ...] | list[str]) -> list[str]:
    """`--set FIELD=VALUE` for each setting, as a worker's command line takes them."""
    return [arg for setting in settings for arg in ("--set", setting)]


def train(script: str | Path, tmp_path: Path, name: str, *settings: str, np: int = 2,
          controller: str = "gloo", expect: int | None = 0, timeout: float = 240,
          env: dict[str, str] | None = None) -> JobRun:
    """One job of `script` with `settings`, reporting into tmp_path/name; its exit status must be `expect`
    (None: any)."""
    out = tmp_path / name
    out.mkdir()
    job = run_job(script, *set_args(settings), out_dir=out, np=np, controller=controller, timeout=timeout,
                  env=env)
    if expect is not None:
        assert job.returncode == expect, job.output
    return job


def start_job(script: str | Path, tmp_path: Path, name: str, *settings: str, np: int = 2,
              controller: str = "gloo", env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    """Start a job in the background, for a test to interrupt: (its `hvdazure run` process, its report
    folder tmp_path/name). Its output (stdout and stderr together) is `finish(proc)`'s."""
    out = tmp_path / name
    out.mkdir()
    script = Path(script) if Path(script).is_absolute() else WORKERS / script
    cmd = [sys.executable, "-m", "hvdazure.cli", "run", "-np", str(np), f"--{controller}", str(script),
           *set_args(settings)]
    proc = subprocess.Popen(cmd, env={**os.environ, "HVDAZURE_TEST_OUT": str(out), STACKS_DIR_ENV: STACKS_DIR,
                                      **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, out


def wait_for(predicate: Callable[[], object], what: str, proc: subprocess.Popen | None = None,
             timeout: float = 180) -> None:
    """Wait until `predicate()` holds; fail (killing `proc`, with its output, and its stacks if it hung) if
    `proc` ends first or the wait passes `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        ended = proc is not None and proc.poll() is not None
        if ended or time.monotonic() > deadline:
            output = stacks = ""
            if proc is not None:
                stacks = "" if ended else stacks_of_tree(proc.pid)
                kill_tree(proc.pid)
                output = proc.communicate()[0]
            raise AssertionError(f"the job ended or hung before {what}:\n{output}\n{stacks}")
        time.sleep(0.01)


def finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    """Wait for a job start_job started to end; its output. Fails, killing it, if it hangs."""
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = stacks_of_tree(proc.pid)
        kill_tree(proc.pid)
        output, _ = proc.communicate()
        raise AssertionError(f"job hung: still running after {timeout}s\n{output}\n{stacks}") from None
    return output


def stacks_of_tree(pid: int) -> str:
    """The stacks of a process and every process below it (a job's `hvdazure run`: all of the job)."""
    try:
        root = psutil.Process(pid)
        return dump_stacks([root, *root.children(recursive=True)], STACKS_DIR)
    except psutil.NoSuchProcess:
        return "(the job's processes were gone before their stacks could be taken)"


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every process below it."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(procs, timeout=10)


def read_reports(out_dir: Path) -> dict[int, dict]:
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in sorted(out_dir.glob("rank-*.json"))}


def processes_running(marker: str) -> list[psutil.Process]:
    """Processes whose command line contains `marker` (to prove a job left nothing behind)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@dataclass
class FinishedRun:
    """A finished run of workers/torch_job.py and the checkpoints it left (copy them before resuming)."""

    job: JobRun
    checkpoint_dir: Path

    def copy_checkpoints(self, into: Path) -> Path:
        """The checkpoints copied into `into` (which must not exist yet), for a test to resume or damage."""
        shutil.copytree(self.checkpoint_dir, into)
        return into


@dataclass
class Trainings:
    """The job that ran several trainings (run_trainings), and each training's reports: `trainings[name]`
    is that training's rank -> report."""

    job: JobRun
    reports: dict[str, dict[int, dict]]

    def __getitem__(self, name: str) -> dict[int, dict]:
        return self.reports[name]


def run_trainings(runs: dict[str, tuple[str, ...]], out_dir: Path, np: int = 2, controller: str = "gloo",
                  script: str = "torch_job.py", timeout: float = 300) -> Trainings:
    """Several trainings of a worker (name -> its FIELD=VALUE settings) in ONE job: each runs in turn on the
    same ranks, as `hvdazure sweep` runs trials (workers/_report.py `main`), so a file of real-rank tests
    pays for one launch, not one per training."""
    for name in runs:
        (out_dir / name).mkdir(parents=True)
    spec = out_dir / "runs.json"
    spec.write_text(json.dumps({name: list(settings) for name, settings in runs.items()}))
    job = run_job(script, "--runs", str(spec), out_dir=out_dir, np=np, controller=controller, timeout=timeout)
    assert job.returncode == 0, job.output
    reports = {name: read_reports(out_dir / name) for name in runs}
    for name, by_rank in reports.items():
        assert sorted(by_rank) == list(range(np)), f"{name}: {job.output}"
    return Trainings(job, reports)


class TorchRuns:
    """Runs of workers/torch_job.py that several tests start identically (the uninterrupted reference, the
    first half of a resume), each started once per session: `get(*settings, np=2)` runs the job with
    `checkpoint_dir` set to a folder of its own on the first call and returns the same run afterwards.
    Where its checkpoints are does not change what a run trains, so a test copies them and goes on."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._runs: dict[tuple[tuple[str, ...], int], FinishedRun] = {}

    def get(self, *settings: str, np: int = 2) -> FinishedRun:
        key = (settings, np)
        if key not in self._runs:
            folder = self._root / f"run-{len(self._runs)}"
            out, ckpt = folder / "reports", folder / "ckpt"
            out.mkdir(parents=True)
            args = [a for s in (*settings, f"checkpoint_dir={ckpt}") for a in ("--set", s)]
            job = run_job("torch_job.py", *args, out_dir=out, np=np, timeout=180)
            assert job.returncode == 0, job.output
            self._runs[key] = FinishedRun(job, ckpt)
        return self._runs[key]
