"""A failing, killed or hung rank stops the whole job promptly, and the exit status says which rank."""

import re
import signal
from pathlib import Path

import pytest
from harness import CONTROLLERS, WORKERS, processes_running, run_job
from rank_output import lines_of

# A failed job must end long before this; the harness turns a longer wait into a "job hung" failure.
NO_HANG_TIMEOUT = 120


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_rank_exiting_nonzero_stops_all_ranks_with_its_exit_code(tmp_path, controller):
    job = run_job("misbehave.py", "exit", "3", out_dir=tmp_path, controller=controller,
                  timeout=NO_HANG_TIMEOUT)

    assert job.returncode == 3, job.output
    assert "hvdazure run: rank 1 failed first, with exit code 3" in job.stderr
    assert not processes_running(str(WORKERS / "misbehave.py"))


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_a_rank_slow_to_exit_is_still_named_and_not_the_peer_that_failed_because_of_it(tmp_path, controller):
    job = run_job("misbehave.py", "slow-exit", "3", out_dir=tmp_path, controller=controller,
                  timeout=NO_HANG_TIMEOUT)

    assert job.returncode == 3, job.output
    assert "hvdazure run: rank 1 failed first, with exit code 3" in job.stderr
    assert not processes_running(str(WORKERS / "misbehave.py"))


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_rank_killed_by_sigkill_is_reported_as_such(tmp_path, controller):
    job = run_job("misbehave.py", "sigkill", out_dir=tmp_path, controller=controller, timeout=NO_HANG_TIMEOUT)

    assert job.returncode == 128 + signal.SIGKILL, job.output
    assert "rank 1 failed first, with exit code 137 (killed by SIGKILL)" in job.stderr
    assert not processes_running(str(WORKERS / "misbehave.py"))


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_timeout_stops_every_rank_and_exits_124(tmp_path, controller):
    job = run_job("misbehave.py", "hang", out_dir=tmp_path, controller=controller,
                  launcher_args=("--timeout", "10"), timeout=NO_HANG_TIMEOUT)

    assert job.returncode == 124, job.output
    assert "hvdazure run: job exceeded --timeout 10s; stopped all ranks" in job.stderr
    # Both ranks had started: the hang mode imports neither torch nor Horovod, so its ranks start as soon as
    # the launcher starts them (horovodrun takes about 5 s to start two ranks here, mpirun under 1 s).
    assert sorted(job.reports) == [0, 1]
    assert not processes_running(str(WORKERS / "misbehave.py"))


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_a_bad_config_value_is_reported_in_a_few_lines_without_the_launchers_traceback(tmp_path, controller):
    job = run_job("torch_job.py", "--set", "batch_size=0", out_dir=tmp_path, controller=controller,
                  timeout=NO_HANG_TIMEOUT)

    assert job.returncode == 2, job.output
    summary = re.search(r"^hvdazure run: rank (\d) failed first, with exit code 2; stopped all ranks "
                        r"\(\d+\.\ds after start\)$", job.stderr, re.MULTILINE)
    assert summary, job.output
    # every rank names it (each parses its own command line), the one that failed first among them: rank 0
    # as one process would, rank 1 marked, both on stderr; no launcher tag, no shell's `Terminated`
    for each in (0, 1):
        assert "hvdazure: error: config field 'batch_size': 0 must be at least 1" in lines_of(job.stderr,
                                                                                             each), job.stderr
    assert "hvdazure: error:" not in job.stdout and "<stderr>" not in job.output
    assert "Terminated" not in job.output, job.output
    assert "Traceback" not in job.output and "detected that one or more processes" not in job.output
    # Per rank at most its config error and the wrapper's failure line, then the summary.
    assert len(job.output.splitlines()) <= 5, job.output
    assert not re.search(r"\d{9,}\.\d", job.output), "raw epoch seconds shown to the user"


def test_verbose_shows_the_launchers_own_report_of_a_failure(tmp_path):
    job = run_job("misbehave.py", "exit", "3", out_dir=tmp_path, launcher_args=("--verbose",),
                  timeout=NO_HANG_TIMEOUT)

    assert job.returncode == 3, job.output
    assert "Horovod detected that one or more processes exited with non-zero status" in job.output
    assert "hvdazure run: rank 1 failed first, with exit code 3" in job.stderr


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_every_rank_names_bad_input_even_a_rank_a_moment_behind(tmp_path, controller):
    """Rank 1 stops on bad input at once, rank 0 a second later (still importing its framework, say):
    the launcher must not kill rank 0 before it says so too (horovodrun and mpirun stop the job when a
    rank exits; failed before the wrapper held a bad-input exit)."""
    script = tmp_path / "bad_input.py"
    script.write_text(
        "import os, sys, time\n"
        "rank = int(os.environ.get('HOROVOD_RANK', os.environ.get('OMPI_COMM_WORLD_RANK', '0')))\n"
        "time.sleep(1.0 if rank == 0 else 0.0)\n"
        "sys.stderr.write(\"hvdazure: error: config field 'batch_size': 0 must be at least 1\\n\")\n"
        "sys.exit(2)\n")
    job = run_job(script, out_dir=tmp_path, controller=controller, timeout=60)

    assert job.returncode == 2, job.output
    for rank in (0, 1):
        assert any(line.startswith("hvdazure: error: config field 'batch_size'")
                   for line in lines_of(job.stderr, rank)), job.stderr
    assert "rank 1" in job.stderr.splitlines()[-1] and "failed first" in job.stderr.splitlines()[-1]


def test_an_error_on_every_rank_is_shown_once_whole_with_the_users_frame_and_every_rank_in_the_log(tmp_path):
    """The same mistake fails on both ranks: one traceback, not two interleaved line by line; the summary
    says the other rank failed with the same error; every rank's output is kept in the named log."""
    script = tmp_path / "both_fail.py"
    script.write_text("import os\n"
                      "print('ready', flush=True)\n"
                      "def load(path):\n"
                      "    return int(path)\n"
                      "load(os.environ.get('DATA', 'not-a-number'))\n")
    job = run_job(script, out_dir=tmp_path, controller="mpi", timeout=60, env={"TMPDIR": str(tmp_path)})

    assert job.returncode == 1, job.output
    assert "ready" in lines_of(job.stdout, 0) and "ready" in lines_of(job.stdout, 1), job.stdout
    assert "ready" not in job.stderr  # stdout stays stdout
    error = "ValueError: invalid literal for int() with base 10: 'not-a-number'"
    assert job.stderr.count("Traceback (most recent call last)") == 1 and job.stderr.count(error) == 1
    lines = job.stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.endswith("Traceback (most recent call last):"))
    tag = lines[start].removesuffix("Traceback (most recent call last):")  # none (rank 0), or `[rank 1] `
    assert tag in ("", "[rank 1] "), job.stderr
    assert lines[start + 1:start + 7] == [f'{tag}  File "{script}", line 5, in <module>',
                                          f"{tag}    load(os.environ.get('DATA', 'not-a-number'))",
                                          f'{tag}  File "{script}", line 4, in load',
                                          f"{tag}    return int(path)",
                                          f"{tag}           ^^^^^^^^^", f"{tag}{error}"], job.stderr
    summary = re.fullmatch(r"hvdazure run: rank (\d) failed first, with exit code 1; rank (\d) failed with "
                           r"the same error.*; stopped all ranks \(\d+\.\ds after start\)", lines[-1])
    assert summary and {summary[1], summary[2]} == {"0", "1"}, job.stderr
    kept = re.fullmatch(r"hvdazure run: 1 traceback not shown in full; every rank's output is in (\S+) "
                        r"\(--verbose shows it all here\)", lines[-2])
    assert kept and Path(kept[1]).parent == tmp_path, job.stderr
    log = Path(kept[1]).read_text()
    assert log.count(error) == 2 and "[0]<stdout>:ready" in log and "[1]<stdout>:ready" in log


def test_a_peers_follow_on_error_is_abridged_below_the_failing_ranks_whole_traceback(tmp_path):
    """Rank 1 raises in user code while rank 0 waits in an allreduce, which then fails with Horovod's
    shutdown error: rank 1's traceback in full, rank 0's cut to its own frame and the error."""
    job = run_job("misbehave.py", "raise", out_dir=tmp_path, timeout=NO_HANG_TIMEOUT,
                  env={"TMPDIR": str(tmp_path)})

    assert job.returncode == 1, job.output
    lines = job.stderr.splitlines()
    cause = lines.index("[rank 1] Traceback (most recent call last):")
    assert lines[cause + 5] == "[rank 1] ValueError: rank 1 dislikes its shard", job.stderr
    follow_on = next(i for i, line in enumerate(lines) if line.startswith("Traceback"))  # rank 0's
    assert re.fullmatch(r"Traceback \(most recent call last; \d+ of \d+ frames not shown\):",
                        lines[follow_on]), job.stderr
    assert lines[follow_on + 1].endswith(", in <module>"), job.stderr  # the script's own frame
    assert lines[follow_on + 2].endswith('hvd.allreduce(torch.ones(1), name="never_completes")'), job.stderr
    assert "HorovodInternalError: Horovod has been shut down" in lines[follow_on + 3], job.stderr
    assert lines[-1].startswith("hvdazure run: rank 1 failed first, with exit code 1; stopped"), job.stderr
