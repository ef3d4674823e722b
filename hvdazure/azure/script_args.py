"""The script's own arguments, read for what they name: which option each argument belongs to, and the
fields its `--set FIELD=VALUE` arguments set. Used to name an argument in a message without its value (a
refused credential) and to find the settings a sweep overrides. No Azure SDK here.

Options are read as TrainConfig and argparse read them: `--set FIELD=VALUE` or `--set=FIELD=VALUE`,
`--name VALUE` or `--name=VALUE`; anything else is named by its position.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

_OPTION = re.compile(r"^--?[A-Za-z][A-Za-z0-9_\-]*$")
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")  # a TrainConfig field or extra.NAME


def argument_names(args: Sequence[str]) -> list[str]:
    """One name per argument, never its value: `--set extra.data_url` for `--set=extra.data_url=...` and
    for the word after `--set`, `--data-url` for `--data-url=...` and for the word after `--data-url`, and
    its position (`3`, counted from 1) for a word that belongs to no option."""
    names = []
    owner: str | None = None  # the option whose value the next word may be
    for index, arg in enumerate(args):
        option, equals, value = arg.partition("=")
        if _OPTION.match(option):
            name = _set_name(value) if option == "--set" and equals else option
            owner = None if equals else option
        elif owner is not None:
            name = _set_name(arg) if owner == "--set" else owner
            owner = None
        else:
            name = str(index + 1)
        names.append(name)
    return names


def set_fields(args: Sequence[str]) -> list[str]:
    """The fields that the `--set FIELD=VALUE` arguments set, in order."""
    return [name.removeprefix("--set ") for name in argument_names(args) if name.startswith("--set ")]


@dataclass(frozen=True)
class Setting:
    """One `--set FIELD=VALUE` of the arguments: the words it takes (`start`, and 1 or 2 of them)."""

    field: str
    value: str
    start: int
    words: int


def settings(args: Sequence[str]) -> list[Setting]:
    """Every `--set FIELD=VALUE` and `--set=FIELD=VALUE` of `args`, in order (as TrainConfig reads them: the
    last one of a field wins)."""
    found = []
    for index, word in enumerate(args):
        if word == "--set" and index + 1 < len(args):
            assignment, words = args[index + 1], 2
        elif word.startswith("--set="):
            assignment, words = word.removeprefix("--set="), 1
        else:
            continue
        field, equals, value = assignment.partition("=")
        if equals and _FIELD.match(field):
            found.append(Setting(field, value, index, words))
    return found


def without_fields(args: Sequence[str], fields: Collection[str]) -> list[str]:
    """`args` less every `--set` of one of `fields` (either form)."""
    dropped = {i for s in settings(args) if s.field in fields for i in range(s.start, s.start + s.words)}
    return [word for index, word in enumerate(args) if index not in dropped]


def _set_name(assignment: str) -> str:
    """`--set FIELD` for `FIELD=VALUE`; `--set` alone when FIELD is not a field's name."""
    field, equals, _ = assignment.partition("=")
    return f"--set {field}" if equals and _FIELD.match(field) else "--set"
