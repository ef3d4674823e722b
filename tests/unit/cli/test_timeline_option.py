"""`hvdazure run --timeline FILE`: the path made absolute and checked before any rank starts, and
HOROVOD_TIMELINE set for the ranks under either controller, over the environment's."""

import os
import subprocess

import pytest
from no_process import must_not_start

from hvdazure.cli import main
from hvdazure.launch.command import LaunchSpec, build_command
from hvdazure.launch.timeline import TimelineStamp


def _fake_run_job(seen):
    def run_job(spec, timeout_s, grace_s, verbose):  # the launcher itself: tests/distributed
        seen["spec"] = spec
        return type("Result", (), {"exit_code": 0})()

    return run_job


def test_a_relative_timeline_is_made_absolute_and_its_folder_created(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("hvdazure.launch.supervisor.run_job", _fake_run_job(seen))

    assert main(["run", "-np", "2", "--timeline", "traces/job.json", "--", "python", "-c", "pass"]) == 0
    assert seen["spec"].timeline == str(tmp_path / "traces" / "job.json")
    assert (tmp_path / "traces").is_dir()
    assert not (tmp_path / "traces" / "job.json").exists()  # the check that it can be written leaves nothing


@pytest.mark.parametrize(("where", "why"), [
    ("folder", "is a directory"),
    ("file/job.json", "cannot make its folder"),
    ("file/deeper/job.json", "cannot make its folder"),
])
def test_a_timeline_that_cannot_be_written_is_refused_in_one_line_before_any_rank_starts(
        capsys, monkeypatch, tmp_path, where, why):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("in the way")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(subprocess, "Popen", must_not_start)
    monkeypatch.setattr("hvdazure.launch.supervisor.run_job", must_not_start)

    assert main(["run", "-np", "2", "--timeline", where, "--", "python", "-c", "pass"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hvdazure: error: --timeline {tmp_path / where}: {why}")
    assert err.count("\n") == 1


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_the_timeline_reaches_every_rank_over_the_environments_own(controller):
    spec = LaunchSpec(num_proc=2, command=["train.py"], controller=controller, timeline="/runs/timeline.json")
    argv, env = build_command(spec, {"PATH": "/usr/bin", "HOROVOD_TIMELINE": "/elsewhere.json"})

    assert env["HOROVOD_TIMELINE"] == "/runs/timeline.json"
    if controller == "mpi":  # horovodrun passes the whole environment on; mpirun what it is told to
        assert "HOROVOD_TIMELINE" in [argv[i + 1] for i, arg in enumerate(argv) if arg == "-x"]


def test_without_the_option_the_environments_timeline_is_left_alone():
    spec = LaunchSpec(num_proc=2, command=["train.py"], controller="gloo")
    _, env = build_command(spec, {"PATH": "/usr/bin", "HOROVOD_TIMELINE": "/elsewhere.json"})

    assert env["HOROVOD_TIMELINE"] == "/elsewhere.json"


def test_the_last_line_says_how_to_open_a_timeline_the_job_wrote_and_not_an_old_one(tmp_path):
    path = tmp_path / "timeline.json"
    path.write_text("[\n")  # a previous job's
    stamp = TimelineStamp.of(str(path))

    assert stamp.report_line().startswith(f"hvdazure run: no Horovod timeline was written to {path}")
    path.write_text('[\n{"name": "ALLREDUCE"},')
    os.utime(path, ns=(0, 1))  # however coarse the file system's clock
    line = stamp.report_line()
    assert line == (f"hvdazure run: Horovod timeline written to {path}; open it in chrome://tracing or "
                    "https://ui.perfetto.dev\n")


def test_the_help_says_the_option_wins_over_the_environment(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--timeline FILE" in help_text
    assert "Sets HOROVOD_TIMELINE for every rank, over one already in the environment" in help_text
