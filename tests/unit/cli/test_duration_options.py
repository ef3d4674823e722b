"""Every option of the CLI that takes a duration takes units (`90`, `90s`, `15m`, `2h`, `1d`, `1h30m`),
through the one parser (core/durations.py), and refuses a bad value in one line with exit status 2 before
anything starts. `hvdazure submit`'s --max-duration and --trial-timeout are read with the job's other checks
(shown as given in their bounds): test_azure_job_settings.py and test_azure_sweep.py."""

from __future__ import annotations

import argparse
import subprocess

import pytest
from no_process import must_not_start

from hvdazure.cli import build_parser, main
from hvdazure.core.durations import FORMS, DurationAction

SWEEP = ["sweep", "-np", "2", "train.py", "--space", "space.yaml", "--metric", "eval_loss"]
COMPUTE = ["azure", "compute", "create", "gpu", "--vm-size", "Standard_NC6s_v3", "--max-nodes", "2"]
# where each option of seconds is, with what its command needs besides
OPTIONS = {
    "run --timeout": (["run", "-np", "2"], "--timeout", ["train.py"], "timeout"),
    "run --grace": (["run", "-np", "2"], "--grace", ["train.py"], "grace"),
    "sweep --timeout": (SWEEP, "--timeout", [], "timeout"),
    "sweep --grace": (SWEEP, "--grace", [], "grace"),
    "bench --timeout": (["bench", "allreduce"], "--timeout", [], "timeout"),
    "compute create --idle-seconds": (COMPUTE, "--idle-seconds", [], "idle_seconds"),
}


@pytest.mark.parametrize("where", OPTIONS)
@pytest.mark.parametrize(("given", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200),
                                                ("1d", 86400), ("1h30m", 5400)])
def test_every_option_of_seconds_takes_units(where, given, seconds):
    before, option, after, dest = OPTIONS[where]

    args = build_parser().parse_args([*before, option, given, *after])

    assert getattr(args, dest) == seconds


@pytest.mark.parametrize("where", OPTIONS)
def test_a_bad_duration_is_one_line_naming_the_option_the_value_and_the_forms(capsys, monkeypatch, where):
    before, option, after, _ = OPTIONS[where]
    monkeypatch.setattr(subprocess, "Popen", must_not_start)

    with pytest.raises(SystemExit) as exit_info:
        main([*before, option, "2x", *after])

    assert exit_info.value.code == 2
    command = "hvdazure " + " ".join(before[:3] if before[0] == "azure" else before[:1])
    assert capsys.readouterr().err == (f"hvdazure: error: {option} 2x: not a duration; {FORMS} "
                                       f"(see {command} --help)\n")


def test_run_gives_the_launcher_the_timeout_and_grace_in_seconds(monkeypatch):
    seen = {}

    def fake_run_job(spec, timeout_s, grace_s, verbose):  # the launcher itself: tests/distributed
        seen["timeout"], seen["grace"] = timeout_s, grace_s
        return type("Result", (), {"exit_code": 0})()

    monkeypatch.setattr("hvdazure.launch.supervisor.run_job", fake_run_job)
    assert main(["run", "-np", "2", "--timeout", "1m", "--grace", "1.5m", "--", "python", "-c", "pass"]) == 0
    assert seen == {"timeout": 60.0, "grace": 90.0}


def test_the_idle_time_of_a_cluster_to_create_is_whole_seconds(capsys):
    from hvdazure.azure import options

    assert options.compute_to_create(build_parser().parse_args([*COMPUTE, "--idle-seconds", "10m"])
                                     ).idle_seconds == 600
    with pytest.raises(SystemExit):
        main([*COMPUTE, "--idle-seconds", "0.5s"])
    assert "--idle-seconds 0.5s: not a whole number of seconds (0.5 s)" in capsys.readouterr().err


def _options(parser: argparse.ArgumentParser, prog: str = "hvdazure"):
    """(command, action) of every option of every (sub)command of the CLI."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{prog} {name}")
        elif action.option_strings:
            yield prog, action
    for name, variant in (getattr(parser, "variants", None) or {}).items():
        yield from _options(variant, f"{prog} {name}")


def test_no_option_of_the_cli_takes_seconds_without_units():
    """A new option of seconds goes through the one parser too: as an action that stores seconds, or kept
    as given for a job's checks (`hvdazure submit`'s two, read by azure/spec/settings.check_duration)."""
    checked_with_the_job = {"max_duration", "trial_timeout"}
    seconds_like = [(prog, action) for prog, action in _options(build_parser())
                    if any(word in f"{action.dest} {action.help or ''} {action.metavar or ''}".lower()
                           for word in ("timeout", "duration", "seconds", "grace", "interval"))
                    and action.nargs != 0 and action.dest not in ("evaluation_interval", "delay_evaluation")]

    assert seconds_like  # the walk finds them
    for prog, action in seconds_like:
        assert isinstance(action, DurationAction) or action.dest in checked_with_the_job, (prog, action.dest)
        assert action.metavar == "DURATION", (prog, action.dest)
