"""A job that hangs says where: when `hvdazure run --timeout` or the test harness's timeout fires, the stacks
of every process of the job (ranks, a forked worker, the launcher) are taken before it is stopped, and
name the function each one hung in (hvdazure/launch/stack_dumps.py). Nothing of the job is left after.

workers/hangs.py: rank 0 waits for a forked child sleeping forever, rank 1 on a lock it holds.
"""

import re
from pathlib import Path

import psutil
import pytest
from harness import WORKERS, finish, processes_running, read_reports, run_job, start_job, wait_for

from hvdazure.launch.stack_dumps import PY_SPY_ENV, py_spy

HANGS = ("rank_0_waits_for_its_worker", "rank_1_waits_on_a_lock", "worker_sleeps_forever")


def sections(stacks: str) -> dict[int, str]:
    """pid -> its section of a dump (from its `--- process PID` header to the next)."""
    parts = re.split(r"^--- process (\d+)", stacks, flags=re.MULTILINE)
    return {int(pid): text for pid, text in zip(parts[1::2], parts[2::2], strict=True)}


def hung_where(stacks: str, reports: dict[int, dict]) -> dict[str, str | None]:
    """The function of HANGS that each of the job's Python processes is in: the innermost its stacks name
    (both py-spy and faulthandler list the most recent call first; a forked worker's stack goes on into
    its parent's frames)."""
    by_pid = sections(stacks)
    processes = {"rank 0": reports[0]["pid"], "rank 1": reports[1]["pid"],
                 "rank 0's worker": reports[0]["worker"]}
    found = {}
    for what, pid in processes.items():
        named = [(at, name) for name in HANGS if (at := by_pid.get(pid, "").find(name)) >= 0]
        found[what] = min(named)[1] if named else None
    return found


EXPECTED = {"rank 0": "rank_0_waits_for_its_worker", "rank 1": "rank_1_waits_on_a_lock",
            "rank 0's worker": "worker_sleeps_forever"}


def test_run_timeout_logs_where_every_process_hung_from_faulthandler_where_py_spy_cannot_attach(tmp_path):
    # no py-spy: as in a container without ptrace, each process's own faulthandler dumps its stacks
    job = run_job("hangs.py", out_dir=tmp_path, controller="mpi", launcher_args=("--timeout", "10"),
                  env={PY_SPY_ENV: ""}, timeout=120)

    assert job.returncode == 124, job.output
    line = re.search(r"^hvdazure run: job exceeded --timeout 10s; stopped all ranks \(where it hung: each "
                     r"process's stacks are in (\S+)\)$", job.stderr, flags=re.MULTILINE)
    assert line, job.output
    assert "not shown in full" not in job.stderr, job.output  # no traceback was held back
    stacks = Path(line.group(1)).read_text()
    Path(line.group(1)).unlink()
    assert sorted(job.reports) == [0, 1], job.output  # both ranks were in their hangs at the timeout
    assert hung_where(stacks, job.reports) == EXPECTED, stacks
    assert "mpirun" in stacks and "hvdazure.launch.rank_wrapper" in stacks  # the launcher, the wrappers
    assert not processes_running(str(WORKERS / "hangs.py"))
    assert not any(psutil.pid_exists(pid) for pid in (job.reports[0]["worker"], job.reports[1]["pid"]))


def test_a_job_past_the_harness_timeout_fails_with_every_process_py_spy_stacks_native_frames_too(tmp_path):
    assert py_spy() is not None, "py-spy is installed with requirements/base.txt (scripts/setup_env.sh)"
    proc, out = start_job("hangs.py", tmp_path, "job", controller="gloo")
    wait_for(lambda: len(list(out.glob("rank-*.json"))) == 2, "both ranks hang", proc)

    with pytest.raises(AssertionError, match="job hung") as hung:
        finish(proc, timeout=1)

    stacks = str(hung.value)
    reports = read_reports(out)
    assert hung_where(stacks, reports) == EXPECTED, stacks
    assert "lock_PyThread_acquire_lock" in sections(stacks)[reports[1]["pid"]], stacks  # a native frame
    assert "horovodrun" in stacks
    assert not processes_running(str(WORKERS / "hangs.py"))
