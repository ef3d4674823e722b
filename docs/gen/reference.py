"""The reference pages generated from the code when the site is built (the hooks in hooks.py call these):
the configuration table from `TrainConfig`'s fields, and the command-line reference from the `hvdazure`
argument parsers. Nothing here is committed as output: change a default, a field's string or a `help=` and
the next build shows it.

A field's meaning is the string literal under it in the class body (an attribute docstring, which griffe
and Sphinx read too); the `# comment` lines between fields head the groups of the table.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import html
import inspect
import os
import textwrap
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal, get_args, get_origin


# --- TrainConfig ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """One row of the configuration table."""

    name: str
    type: str
    default: str
    meaning: str
    group: str


def config_fields(cls: type) -> list[FieldDoc]:
    """Every dataclass field of `cls`, in order, with its type, default, meaning and group as the code
    states them. A field without a string under it is an error: the table would have a hole."""
    meanings, groups = _field_strings(cls)
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if f.name not in meanings:
            raise ValueError(f"{cls.__name__}.{f.name} has no docstring: put its meaning in a string under "
                             "it")
        rows.append(FieldDoc(f.name, describe_type(hints[f.name]), describe_default(f), meanings[f.name],
                             groups.get(f.name, "")))
    return rows


def _field_strings(cls: type) -> tuple[dict[str, str], dict[str, str]]:
    """Each field's docstring, and the text of the last `# comment` line above it (its group)."""
    source = textwrap.dedent(inspect.getsource(cls))
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    lines = source.splitlines()
    meanings: dict[str, str] = {}
    groups: dict[str, str] = {}
    group = ""
    previous_end = body.body[0].lineno - 1 if body.body else 0
    statements = body.body
    for i, node in enumerate(statements):
        for line in lines[previous_end:node.lineno - 1]:  # comment lines between the statements
            text = line.strip()
            if text.startswith("#"):
                group = text.lstrip("# ").split(":")[0].strip()
        previous_end = node.end_lineno or node.lineno
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            following = statements[i + 1] if i + 1 < len(statements) else None
            if (isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)):
                meanings[node.target.id] = " ".join(inspect.cleandoc(following.value.value).split())
            groups[node.target.id] = group
    return meanings, groups


def describe_type(hint: Any) -> str:
    """A type as a config file's author reads it: `int`, `float or null`, `one of 'a', 'b'`."""
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_type(a) for a in get_args(hint))
    if hint is type(None):
        return "null"
    if origin is dict:
        return "mapping"
    return getattr(hint, "__name__", str(hint))


def describe_default(f: dataclasses.Field[Any]) -> str:
    """The default as YAML writes it."""
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{}" if not value else repr(value)
    return str(value)


def config_table(cls: type | None = None) -> str:
    """The configuration reference: a table per group of fields, a row per field, an anchor per field
    (`#batch_size`)."""
    if cls is None:
        from hvdazure.core.config import TrainConfig

        cls = TrainConfig
    out: list[str] = []
    group = None
    for row in config_fields(cls):
        if row.group != group:
            group = row.group
            out += ["", f"### {group[:1].upper()}{group[1:]}" if group else "### Settings", "",
                    "| field | type | default | meaning |", "| --- | --- | --- | --- |"]
        out.append(f'| <span id="{row.name}"></span>`{row.name}` | {_cell(row.type)} | `{row.default}` | '
                   f"{_cell(row.meaning)} |")
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    """Text for a Markdown table cell: no pipe ends the cell, no angle bracket starts a tag."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


# --- the command line ------------------------------------------------------------------------------------
def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """The reference of every `hvdazure` command: a section per command and subcommand (`hvdazure submit
    sweep` included), with its usage, description, options and examples, all read from the parsers."""
    if parser is None:
        from hvdazure.cli import build_parser

        parser = build_parser()
    with _columns(100):
        return "\n".join(_parser_sections(parser, level=2)) + "\n"


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    """argparse wraps usage lines to the terminal's width: make it the same on every machine."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, help, parser) of each subcommand of `parser`: argparse's sub-parsers, then the CLI's own
    variants (`hvdazure submit sweep`: see cli._Parser)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            found += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    for name, sub in (getattr(parser, "variants", None) or {}).items():
        found.append((name, (sub.description or "").split(". ")[0], sub))
    return found


def _parser_sections(parser: argparse.ArgumentParser, level: int) -> list[str]:
    out = [f"{'#' * level} {parser.prog}", ""]
    if parser.description:
        out += [_text(parser.description), ""]
    out += ["```text", parser.format_usage().strip(), "```", ""]
    children = subcommands(parser)
    if children:
        out += ["| command | what it does |", "| --- | --- |"]
        out += [f"| [`{sub.prog}`](#{_anchor(sub.prog)}) | {_cell(_text(help_))} |"
                for _, help_, sub in children]
        out.append("")
    for group in parser._action_groups:
        rows = [_option_row(parser, action) for action in group._group_actions
                if action.help is not argparse.SUPPRESS and not isinstance(action, argparse._SubParsersAction)
                and not isinstance(action, argparse._HelpAction)]
        if rows:
            title = group.title or "options"
            out += [f"**{_text(title)}**", "", "| option | default | meaning |", "| --- | --- | --- |", *rows,
                    ""]
    if parser.epilog:
        out += ["```text", parser.epilog.strip(), "```", ""]
    for _, _, sub in children:
        out += _parser_sections(sub, level + 1 if level < 4 else 4)
    return out


def _option_row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    if action.option_strings:
        invocation = ", ".join(action.option_strings)
        if action.nargs != 0:
            invocation += " " + formatter._format_args(action, action.dest.upper())
    elif action.nargs == argparse.REMAINDER:
        invocation = f"{action.metavar or action.dest} ..."
    else:
        invocation = formatter._format_args(action, action.dest)
    help_ = formatter._expand_help(action) if action.help else ""
    if action.choices and not isinstance(action.choices, dict) and action.nargs != 0:
        help_ += f" (one of: {', '.join(map(str, action.choices))})"
    default = parser.get_default(action.dest) if action.nargs != 0 else None
    shown = "" if default in (None, argparse.SUPPRESS, [], "") or action.nargs == argparse.REMAINDER \
        else f"`{default}`"
    return f"| `{_cell(invocation)}` | {shown} | {_cell(_text(help_))} |"


def _text(text: str) -> str:
    """Help text as one Markdown paragraph, nothing in it taken for HTML."""
    return html.escape(" ".join(text.split()), quote=False)


def _anchor(prog: str) -> str:
    """The id MkDocs gives the heading `prog` (toc's slugify: lower case, spaces to dashes)."""
    return "-".join(prog.lower().split())
