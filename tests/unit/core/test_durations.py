"""The one duration parser (hvdazure/core/durations.py): every form an option of seconds takes, every form
it refuses with the one line that names the option, the value and the forms, and how a duration is shown
back."""

from __future__ import annotations

import argparse

import pytest

from hvdazure.core.durations import (
    FORMS,
    DurationAction,
    DurationError,
    as_units,
    describe,
    parse_duration,
    parse_whole_seconds,
)


@pytest.mark.parametrize(("given", "seconds"), [
    ("90", 90), ("90s", 90), ("15m", 900), ("90m", 5400), ("2h", 7200), ("1d", 86400), ("1h30m", 5400),
    ("1d12h", 129600), ("1d2h3m4s", 93784), ("1h 30m", 5400), ("  2h ", 7200), ("0", 0), ("0s", 0),
    ("1.5h", 5400), ("0.5s", 0.5), ("2.5", 2.5), ("1.1h", 3960), ("36500d", 36500 * 86400),
    (7200, 7200), (2.5, 2.5), (0, 0),
])
def test_every_form_is_read_in_seconds(given, seconds):
    assert parse_duration(given, "--timeout") == seconds


@pytest.mark.parametrize("given", [
    "", " ", "-5", "-1m", "+5", "1h30", "m", "h1", "1.5.2h", "2x", "2H", "1 h", "30m1h", "1h1h", "1e3",
    "1e400", ".5h", "5.h", "90 minutes", "1:30", "inf", "nan", -5, -0.5, float("nan"), float("inf"), True,
    None,
])
def test_what_is_no_duration_is_one_line_naming_the_option_the_value_and_the_forms(given):
    with pytest.raises(DurationError) as error:
        parse_duration(given, "--max-duration")

    message = str(error.value)
    shown = given.strip() if isinstance(given, str) and given.strip() else repr(given)
    assert message == f"--max-duration {shown}: not a duration; {FORMS}"
    assert FORMS == "use seconds (90) or units: 90s, 15m, 2h, 1d, 1h30m"


@pytest.mark.parametrize("given", ["36501d", "9" * 400, "99999999999999999999d", 10.0**300])
def test_a_duration_past_a_hundred_years_is_refused_not_overflowed(given):
    with pytest.raises(DurationError, match=r"^--timeout .+: longer than 36500d \(100 years\)$"):
        parse_duration(given, "--timeout")


def test_whole_seconds_take_units_and_exact_fractions_but_no_fraction_of_a_second():
    assert parse_whole_seconds("1.1h", "--max-duration") == 3960  # exact: 1.1 * 3600 in floats is not
    assert parse_whole_seconds("1.5m", "--max-duration") == 90
    assert isinstance(parse_whole_seconds("2h", "--max-duration"), int)
    with pytest.raises(DurationError, match=r"^--max-duration 90\.5s: not a whole number of seconds "
                                            r"\(90\.5 s\)$"):
        parse_whole_seconds("90.5s", "--max-duration")
    with pytest.raises(DurationError, match=r"^--max-duration 2x: not a duration"):
        parse_whole_seconds("2x", "--max-duration")


@pytest.mark.parametrize(("seconds", "units", "shown"), [
    (7200, "2h", "2h (7200 s)"), (5400, "1h30m", "1h30m (5400 s)"), (90, "1m30s", "1m30s (90 s)"),
    (604801, "7d1s", "7d1s (604801 s)"), (86400, "1d", "1d (86400 s)"), (45, "45s", "45 s"),
    (0.5, "0.5s", "0.5 s"), (0, "0s", "0 s"), (90.5, "1m30.5s", "1m30.5s (90.5 s)"),
    (36500 * 86400, "36500d", "36500d (3153600000 s)"),
])
def test_a_duration_is_shown_back_in_units_with_its_seconds(seconds, units, shown):
    assert (as_units(seconds), describe(seconds)) == (units, shown)
    assert parse_duration(units, "--timeout") == seconds  # what is shown reads back as the same duration


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise SystemExit(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="test")
    parser.add_argument("--timeout", action=DurationAction, positive=True)
    parser.add_argument("--idle", action=DurationAction, whole=True, default=600)
    return parser


def test_the_argparse_action_stores_seconds_and_leaves_the_default_alone():
    args = _parser().parse_args(["--timeout", "1h30m", "--idle=10m"])
    assert (args.timeout, args.idle) == (5400.0, 600)
    assert isinstance(args.idle, int)
    assert _parser().parse_args([]).idle == 600


@pytest.mark.parametrize(("argv", "message"), [
    (["--timeout", "2x"], f"--timeout 2x: not a duration; {FORMS}"),
    (["--timeout=1h30"], f"--timeout 1h30: not a duration; {FORMS}"),
    (["--timeout", "0"], "--timeout 0: must be more than 0 seconds"),
    (["--timeout", "0s"], "--timeout 0s: must be more than 0 seconds"),
    (["--idle", "1.5s"], "--idle 1.5s: not a whole number of seconds (1.5 s)"),
])
def test_the_argparse_action_refuses_in_the_parsers_one_line(argv, message):
    with pytest.raises(SystemExit) as refusal:
        _parser().parse_args(argv)

    assert str(refusal.value) == message
