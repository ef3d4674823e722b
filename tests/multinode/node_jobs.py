"""Running `hvdazure run -np 4 -H node0:2,node1:2` on two nodes (`two_nodes()`), started on node0 as a user
would.

The job runs in `nodes.local`, a directory each node has privately: workers' reports (HVDAZURE_TEST_OUT,
tests/distributed/workers/_report.py), checkpoints and outputs written there stay on the node that wrote
them, and the test reads them on the host from `node.dir`.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from two_nodes import TwoNodes, remove_stale, unavailable

from hvdazure.launch.stack_dumps import dump_stacks

REPO = Path(__file__).resolve().parents[2]
WORKERS = REPO / "tests" / "distributed" / "workers"
HOSTS = "node0:2,node1:2"
NODE_OF_RANK = {0: "node0", 1: "node0", 2: "node1", 3: "node1"}  # -map-by slot: each node's slots in turn
NO_HANG_TIMEOUT = 240  # a job here ends long before this; a longer wait is a hang


@contextlib.contextmanager
def two_nodes(root: Path, unroutable_interface: bool = False) -> Iterator[TwoNodes]:
    """node0 and node1 for the duration of the block; the block fails if anything is left behind."""
    reason = unavailable()
    if reason:
        pytest.skip(f"two nodes need network namespaces: {reason}")
    cluster = TwoNodes(root)
    try:
        remove_stale()
        cluster.start()
        if unroutable_interface:
            cluster.add_unroutable_interface()
    except OSError as exc:
        problems = cluster.close()
        pytest.skip(f"cannot create network namespaces here: {'; '.join([str(exc), *problems])}")
    try:
        yield cluster
    finally:
        problems = cluster.close()
        assert not problems, f"left behind: {problems}"


@dataclass
class JobRun:
    returncode: int
    stdout: str
    stderr: str
    reports: dict[int, dict]  # rank -> what it reported, from the node it ran on
    reported_from: dict[int, str]  # rank -> the node whose directory holds its report

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def start(nodes: TwoNodes, script: str | Path, *args: str, controller: str, launcher_args: tuple = (),
          env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start the job on node0 and return at once."""
    for node in nodes.nodes:
        (node.dir / "reports").mkdir(exist_ok=True)
    script = Path(script) if Path(script).is_absolute() else WORKERS / script
    cmd = [sys.executable, "-m", "hvdazure.cli", "run", "-np", "4", "-H", HOSTS, f"--{controller}",
           *launcher_args, str(script), *args]
    job_env = nodes.env(HVDAZURE_TEST_OUT=str(nodes.local / "reports"), **(env or {}))
    return nodes.popen("node0", cmd, env=job_env, cwd=nodes.local, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)


def finish(nodes: TwoNodes, proc: subprocess.Popen, timeout: float = NO_HANG_TIMEOUT) -> JobRun:
    """Wait for the job to end (a failed test if it hangs) and collect the reports from both nodes."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = stacks_on_nodes(nodes)
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"job hung: still running after {timeout}s\n{stdout}\n{stderr}\n"
                             f"{stacks}") from None
    reports, reported_from = {}, {}
    for node in nodes.nodes:
        for path in sorted((node.dir / "reports").glob("rank-*.json")):
            rank = int(path.stem.split("-")[1])
            reports[rank], reported_from[rank] = json.loads(path.read_text()), node.name
    return JobRun(proc.returncode, stdout, stderr, reports, reported_from)


def stacks_on_nodes(nodes: TwoNodes) -> str:
    """The stacks of every process on both nodes (py-spy: hvdazure/launch/stack_dumps.py): where a job
    hung."""
    processes = []
    for node in nodes.nodes:
        for pid in nodes.pids(node.name):
            with contextlib.suppress(psutil.NoSuchProcess):
                processes.append(psutil.Process(pid))
    return dump_stacks(processes)


def run(nodes: TwoNodes, script: str | Path, *args: str, controller: str, launcher_args: tuple = (),
        env: dict[str, str] | None = None) -> JobRun:
    """Run the job to its end."""
    return finish(nodes, start(nodes, script, *args, controller=controller, launcher_args=launcher_args,
                               env=env))


def settings(*assignments: str) -> list[str]:
    """TrainConfig overrides as `--set` arguments."""
    return [arg for assignment in assignments for arg in ("--set", assignment)]


def wait_for(predicate, what: str, proc: subprocess.Popen, timeout: float = NO_HANG_TIMEOUT) -> None:
    """Wait until `predicate()`; fail if the job ends first or it takes longer than `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before {what}:\n{proc.stdout.read()}\n{proc.stderr.read()}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_until_empty(nodes: TwoNodes, timeout: float = 60) -> dict[str, list[int]]:
    """Wait for both nodes to have no process left; return what is still running after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        left = {node.name: nodes.pids(node.name) for node in nodes.nodes}
        if not any(left.values()) or time.monotonic() > deadline:
            return {name: pids for name, pids in left.items() if pids}
        time.sleep(0.2)
