"""Durations as users type them, for every option and setting of hvdazure that takes one (`hvdazure run
--timeout` and `--grace`, `hvdazure submit --max-duration`, `--trial-timeout`, ...): one grammar, one
error line, one way to show a duration back.

The grammar: a number of seconds (`90`, `2.5`), or numbers with units, largest first, each unit once:
`90s`, `15m`, `2h`, `1d`, `1h30m`, `1d12h`, `1.5h` (s, m, h, d; lowercase: `M` would be read as months by
some). Spaces between the parts are allowed (`1h 30m`). Nothing else: no sign (a duration is never
negative), no exponent, no bare number after units (`1h30` could mean 30 minutes or 30 seconds). The
arithmetic is exact (fractions), so `1.1h` is exactly 3960 seconds and an option of whole seconds takes it.

Hand-written rather than a dependency: pytimeparse and humanfriendly each take a wider, looser grammar
(`1.2.3`-like typos, words, ISO forms) with their own error text, and an error that names the option and
the forms taken is the point here; the grammar is a dozen lines.

Pure: no imports beyond the standard library's light ones, so any layer (the CLI's argparse types, the
Azure job's checks, the config) can call it.
"""

from __future__ import annotations

import argparse
import itertools
import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

FORMS = "use seconds (90) or units: 90s, 15m, 2h, 1d, 1h30m"
UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
LONGEST = 36500 * UNITS["d"]  # 100 years: longer is a typo, and past what Python's waits take (292 years)
_NUMBER = r"\d+(?:\.\d+)?"
_BARE = re.compile(_NUMBER)
_PART = re.compile(rf"({_NUMBER})([dhms])\s*")
_PARTS = re.compile(rf"(?:{_NUMBER}[dhms]\s*)+")


class DurationError(ValueError):
    """A value that is not a duration, or not one the option takes; the message is one line that names the
    option, the value as given and what it takes."""


def parse_duration(value: str | float, option: str) -> float:
    """`value` (text as typed, or a number of seconds from Python or YAML) in seconds; DurationError naming
    `option` (`--timeout`, a config field) otherwise."""
    return float(_seconds(value, option))


def parse_whole_seconds(value: str | float, option: str) -> int:
    """`value` in whole seconds, for what takes no fraction (Azure ML's limits); DurationError otherwise."""
    seconds = _seconds(value, option)
    if seconds.denominator != 1:
        raise DurationError(f"{option} {_given(value)}: not a whole number of seconds ({_plain(seconds)} s)")
    return int(seconds)


def _seconds(value: str | float, option: str) -> Fraction:
    """The parse itself, exact: text by the grammar, a number from Python or YAML as it is."""
    if isinstance(value, str):
        text = value.strip()
        parts = _PART.findall(text)
        if _BARE.fullmatch(text):
            seconds = Fraction(text)
        elif _PARTS.fullmatch(text) and _largest_first([unit for _, unit in parts]):
            seconds = sum((Fraction(number) * UNITS[unit] for number, unit in parts), Fraction(0))
        else:
            raise DurationError(f"{option} {_given(value)}: not a duration; {FORMS}")
    elif isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf"):
        seconds = Fraction(value)
    else:  # a negative number, nan, inf, a bool, None, a list
        raise DurationError(f"{option} {_given(value)}: not a duration; {FORMS}")
    if seconds > LONGEST:
        raise DurationError(f"{option} {_given(value)}: longer than 36500d (100 years)")
    return seconds


def _largest_first(units: Sequence[str]) -> bool:
    """Each unit once, from days down to seconds."""
    order = list(UNITS)
    ranks = [order.index(unit) for unit in units]
    return all(a < b for a, b in itertools.pairwise(ranks))


def _given(value: Any) -> str:
    """The value as the user gave it, for a message: text as typed (quoted when blank), a number as Python
    writes it."""
    return value.strip() if isinstance(value, str) and value.strip() else repr(value)


def _plain(seconds: float | Fraction) -> str:
    """A number of seconds without float noise or an exponent: 7200, 90.5, 0.25."""
    return f"{float(seconds):.6f}".rstrip("0").rstrip(".")


def as_units(seconds: float) -> str:
    """`seconds` in the grammar's units, largest first: 5400 -> '1h30m', 90.5 -> '1m30.5s', 0 -> '0s'."""
    whole, fraction = divmod(Fraction(seconds).limit_denominator(10**6), 1)
    parts: list[str] = []
    rest = int(whole)
    for unit, size in UNITS.items():
        count, rest = divmod(rest, size)
        if unit == "s":
            tail = count + fraction
            if tail or not parts:
                parts.append(f"{_plain(tail)}s")
        elif count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def describe(seconds: float) -> str:
    """A duration shown back to the user: '2h (7200 s)', '1h30m (5400 s)'; under a minute just '45 s'."""
    plain = f"{_plain(seconds)} s"
    return plain if seconds < 60 else f"{as_units(seconds)} ({plain})"


class DurationAction(argparse.Action):
    """An argparse action for an option of seconds that takes units too (`--timeout 90m`): stores seconds
    (a float; an int with `whole=True`), refusing a bad value in one line that names the option, the value
    and the forms. `positive=True` refuses 0 as well. Used as `add_argument(..., action=DurationAction)`."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, whole: bool = False,
                 positive: bool = False, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.whole, self.positive = whole, positive

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        option = option_string or self.dest
        try:
            seconds: float = (parse_whole_seconds if self.whole else parse_duration)(values, option)
        except DurationError as exc:
            parser.error(str(exc))
        if self.positive and seconds <= 0:
            parser.error(f"{option} {values}: must be more than 0 seconds")
        setattr(namespace, self.dest, seconds)
