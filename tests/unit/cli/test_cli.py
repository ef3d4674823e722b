"""The CLI turns bad input into one clear line and exit status 2, before starting anything."""

import subprocess
import sys

import pytest
from no_process import must_not_start

from hvdazure.cli import main


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "-np", "0", "train.py"], "hvdazure: error: -np must be at least 1, got 0"),
    (["run", "-np", "2"], "hvdazure: error: no command given to run on each rank"),
    (["run", "-np", "2", "--"], "hvdazure: error: no command given to run on each rank"),
    (["run", "-np", "2", "-H", "host:x", "t.py"], "hvdazure: error: bad host entry 'host:x'"),
    (["run", "-np", "2", "--hostfile", "/no/such/file", "t.py"],
     "hvdazure: error: hostfile not found: /no/such/file"),
])
def test_bad_run_arguments_fail_with_one_line_naming_the_value(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "-np", "2", "--timeout", "-1", "t.py"], "--timeout -1: not a duration; use seconds (90) or "
                                                    "units"),
    (["run", "-np", "two", "t.py"], "invalid int value: 'two'"),
    (["run", "-np", "2", "--gloo", "--mpi", "t.py"], "not allowed with argument"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_malformed_arguments_are_rejected_by_the_parser(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_command_after_double_dash_is_taken_verbatim(monkeypatch):
    seen = {}

    def fake_run_job(spec, timeout_s, grace_s, verbose):  # the launcher itself: tests/distributed
        seen["spec"], seen["timeout"], seen["grace"], seen["verbose"] = spec, timeout_s, grace_s, verbose
        return type("Result", (), {"exit_code": 7})()

    monkeypatch.setattr("hvdazure.launch.supervisor.run_job", fake_run_job)
    assert main(["run", "-np", "3", "--mpi", "--timeout", "5", "--", "python", "-c", "pass"]) == 7
    assert seen["spec"].command == ["python", "-c", "pass"]
    assert (seen["spec"].num_proc, seen["spec"].controller) == (3, "mpi")
    assert (seen["timeout"], seen["grace"], seen["verbose"]) == (5.0, 30.0, False)


@pytest.mark.parametrize("command", [
    ["missing.py", "--set", "epochs=1"], ["python", "missing.py"], ["--", "python3", "missing.py"],
])
def test_a_missing_script_fails_in_one_line_before_any_rank_starts(capsys, monkeypatch, tmp_path, command):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(subprocess, "Popen", must_not_start)

    assert main(["run", "-np", "2", *command]) == 2
    assert capsys.readouterr().err == (
        f"hvdazure: error: script not found: missing.py (no such file in {tmp_path})\n")


def test_the_cli_reports_a_missing_script_with_exit_status_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hvdazure.cli", "run", "-np", "2", "nope.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)

    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith("hvdazure: error: script not found: nope.py")
    assert proc.stderr.count("\n") == 1


def test_the_network_interface_option_reaches_the_launch_request(monkeypatch):
    seen = {}

    def fake_run_job(spec, timeout_s, grace_s, verbose):
        seen["spec"] = spec
        return type("Result", (), {"exit_code": 0})()

    monkeypatch.setattr("hvdazure.launch.supervisor.run_job", fake_run_job)
    argv = ["run", "-np", "4", "-H", "node1:2,node2:2", "--network-interface", "10.0.0.0/24", "t.py"]
    assert main(argv) == 0
    assert seen["spec"].network_interface == "10.0.0.0/24"


def test_a_network_interface_this_machine_lacks_fails_in_one_line_before_any_rank_starts(capsys, monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", must_not_start)

    assert main(["run", "-np", "2", "--network-interface", "nosuch0", "--", "python", "-c", "pass"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hvdazure: error: --network-interface nosuch0: no such interface here (here: lo ")
    assert err.count("\n") == 1


IMAGE = "myacr.azurecr.io/hvdazure-gpu:0.1.0"
SUBMIT = ["train.py", "--compute", "gpu-cluster", "--image", IMAGE, "--dry-run"]
SWEEP_JOB = [*SUBMIT, "--space", "space.yaml", "--metric", "eval_loss"]


@pytest.mark.parametrize(("argv", "message"), [
    (["submit", *SUBMIT, "--nodes", "two"], "argument --nodes: invalid int value: 'two'"),
    (["submit", *SUBMIT, "-ppn", "x"], "argument --processes-per-node/-ppn: invalid int value: 'x'"),
    (["submit", "train.py", "--image", IMAGE], "the following arguments are required: --compute"),
    (["submit", *SUBMIT, "--nodse", "2"], "unrecognized arguments: --nodse 2"),
    (["submit", "sweep", *SWEEP_JOB, "--trials", "many"], "argument --trials: invalid int value: 'many'"),
    (["submit", "sweep", *SWEEP_JOB, "--early-termination", "asha"],
     "argument --early-termination: invalid choice: 'asha'"),
    (["submit", "in-job-sweep", *SWEEP_JOB, "--ranks-per-trial", "a"],
     "argument --ranks-per-trial: invalid int value: 'a'"),
    (["run", "-np", "two", "t.py"], "argument -np/--num-proc: invalid int value: 'two'"),
    (["run", "-np", "2", "--gloo", "--mpi", "t.py"], "argument --mpi: not allowed with argument --gloo"),
    (["sweep", "-np", "x", "t.py", "--space", "s.yaml", "--metric", "m"],
     "argument -np/--num-proc: invalid int value: 'x'"),
    (["sweep", "-np", "2", "t.py", "--metric", "m"], "the following arguments are required: --space"),
    (["bench", "nosuch"], "argument NAME: invalid choice: 'nosuch'"),
    (["data", "pack", "in", "out", "--samples-per-shard", "x"],
     "argument --samples-per-shard: invalid int value: 'x'"),
    (["data", "index"], "the following arguments are required: SOURCE"),
    (["azure", "compute", "create", "c", "--vm-size", "S", "--max-nodes", "x"],
     "argument --max-nodes: invalid int value: 'x'"),
    (["frobnicate"], "argument COMMAND: invalid choice: 'frobnicate'"),
])
def test_an_option_the_parser_refuses_is_one_line_with_status_2_and_no_usage(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)

    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith(f"hvdazure: error: {message}")
    assert err.count("\n") == 1, err
