"""The CLI turns bad input into one clear line and exit status 2, before starting anything."""

import pytest

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
    (["run", "-np", "2", "--timeout", "-1", "t.py"], "must be positive, got '-1'"),
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

    def fake_run_job(spec, timeout_s, grace_s):  # the launcher itself is covered by tests/distributed
        seen["spec"], seen["timeout"], seen["grace"] = spec, timeout_s, grace_s
        return type("Result", (), {"exit_code": 7})()

    monkeypatch.setattr("hvdazure.launch.supervisor.run_job", fake_run_job)
    assert main(["run", "-np", "3", "--mpi", "--timeout", "5", "--", "python", "-c", "pass"]) == 7
    assert seen["spec"].command == ["python", "-c", "pass"]
    assert (seen["spec"].num_proc, seen["spec"].controller) == (3, "mpi")
    assert (seen["timeout"], seen["grace"]) == (5.0, 30.0)
