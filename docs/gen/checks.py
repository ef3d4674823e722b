"""Checks that keep prose in step with the code: every `hvdazure.NAME` a page names exists, every repository
path it names exists, every `--set FIELD=` names a TrainConfig field, and every `hvdazure ...` command line
in a shell block parses with the real argument parser. The site's build runs them on every page (hooks.py:
a finding fails `mkdocs build --strict`), and tests/docs/ on README.md and CONTRIBUTING.md.

Resolution is static (the modules' source is read, not imported), so checking never imports PyTorch,
TensorFlow or the Azure SDKs.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import io
import re
import shlex
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_DOTTED = re.compile(r"(?<![\w./-])hvdazure(?:\.[A-Za-z_]\w*)+")
_REPO_DIRS = ("hvdazure", "tests", "samples", "benchmarks", "docker", "scripts", "requirements", "docs")
_ROOT_FILES = ("versions.env", "setup.py", "pyproject.toml", "Makefile", "mkdocs.yml", "README.md",
               "CONTRIBUTING.md", "CHANGELOG.md")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(rf"^(?:\./)?((?:{'|'.join(_REPO_DIRS)})/[\w.*/-]*"
                   rf"|{'|'.join(map(re.escape, _ROOT_FILES))})$")
_SET_FIELD = re.compile(r"--set[ =]'?([a-z_]+)=")
_FENCE = re.compile(r"^([ \t]*)(`{3,})[ \t]*(\w*)[^\n]*\n(.*?)^\1\2[ \t]*$", re.MULTILINE | re.DOTALL)
_PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]+")


def stale_references(markdown: str, root: Path = ROOT) -> list[str]:
    """Each reference in `markdown` that the code no longer has, as one line saying what and why."""
    found: list[str] = []
    for name in sorted(set(_DOTTED.findall(markdown))):
        if any(_PLACEHOLDER.fullmatch(part) for part in name.split(".")):
            continue  # hvdazure.NAME: a placeholder, not a name
        why = _unresolved(name.rstrip("."), root)
        if why:
            found.append(f"`{name}`: {why}")
    for span in sorted(set(_CODE_SPAN.findall(markdown))):
        match = _PATH.match(span.strip().rstrip(":,"))
        if match and not _path_exists(match.group(1), root):
            found.append(f"`{span}`: no such file or folder in the repository")
    fields = _config_fields(root)
    for name in sorted(set(_SET_FIELD.findall(markdown))):
        if name not in fields and name != "extra":
            found.append(f"--set {name}=...: TrainConfig has no field {name!r}")
    for command in shell_commands(markdown):
        why = command_error(command)
        if why:
            found.append(f"`{' '.join(command)}`: {why}")
    return found


# --- Python names ----------------------------------------------------------------------------------------
def _unresolved(dotted: str, root: Path) -> str | None:
    """None if `dotted` names a module of the package or something defined in one, else why not."""
    parts = dotted.split(".")
    module_parts = parts[:1]
    for part in parts[1:]:  # the longest prefix that is a module or package
        if _module_file(root, [*module_parts, part]) is None:
            break
        module_parts.append(part)
    rest = parts[len(module_parts):]
    if not rest:
        return None
    path = _module_file(root, module_parts)
    assert path is not None
    defined = _defined_names(path)
    if rest[0] not in defined:
        return f"{'.'.join(module_parts)} defines no {rest[0]!r}"
    source = path.read_text()
    for attribute in rest[1:]:  # a method or attribute: it must at least be named in the module
        if not re.search(rf"\b{re.escape(attribute)}\b", source) and not _named_in_package(root, attribute):
            return f"{'.'.join(module_parts)}.{rest[0]} has no {attribute!r}"
    return None


def _module_file(root: Path, parts: list[str]) -> Path | None:
    base = root.joinpath(*parts)
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _defined_names(path: Path) -> frozenset[str]:
    """Top-level names of a module: definitions, imports, `__all__`, and the keys of its dict literals
    (the lazy exports of hvdazure.azure and hvdazure.data), and the names its `__getattr__` compares."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            value = node.value
            if isinstance(value, ast.Dict):
                names.update(_strings(k for k in value.keys if k is not None))
            if isinstance(value, ast.List | ast.Tuple):
                names.update(_strings(value.elts))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            names.update(_strings(ast.walk(node)))
    return frozenset(names)


def _strings(nodes: Iterable[ast.AST]) -> set[str]:
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


@functools.cache
def _named_in_package(root: Path, name: str) -> bool:
    pattern = re.compile(rf"\bdef {re.escape(name)}\b|\b{re.escape(name)}\s*[:=]")
    return any(pattern.search(p.read_text()) for p in (root / "hvdazure").rglob("*.py"))


# --- repository paths ------------------------------------------------------------------------------------
def _path_exists(text: str, root: Path) -> bool:
    pattern = _PLACEHOLDER.sub("*", text.rstrip("/"))  # hvdazure/bench/NAME_torch.py: any NAME
    if "*" in pattern:
        return any(root.glob(pattern))
    return (root / pattern).exists()


# --- configuration fields --------------------------------------------------------------------------------
@functools.cache
def _config_fields(root: Path) -> frozenset[str]:
    tree = ast.parse((root / "hvdazure" / "core" / "config.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "TrainConfig":
            return frozenset(n.target.id for n in node.body
                             if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
    raise LookupError("hvdazure/core/config.py defines no TrainConfig")


# --- command lines ---------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Fence:
    """A fenced code block: its language, the marker on the line before it (`run`, `illustration` or ''),
    what follows `run:` in that marker (the arguments a snippet runs with), its code, and its first line."""

    language: str
    marker: str
    arguments: str
    code: str
    line: int


_MARKER = re.compile(r"<!--\s*(run|illustration)\b\s*:?\s*(.*?)\s*-->\s*$")


def fences(markdown: str) -> list[Fence]:
    """Every fenced code block of `markdown`."""
    found = []
    for match in _FENCE.finditer(markdown):
        before = markdown[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.search(before)
        code = "\n".join(line.removeprefix(match.group(1)) for line in match.group(4).splitlines())
        found.append(Fence(match.group(3), marker.group(1) if marker else "",
                           marker.group(2) if marker else "", code, markdown[:match.start()].count("\n") + 1))
    return found


def shell_commands(markdown: str) -> list[list[str]]:
    """The arguments of each `hvdazure` command line in the shell blocks of `markdown`."""
    commands = []
    for fence in fences(markdown):
        if fence.language not in ("bash", "sh", "shell", "console"):
            continue
        text = re.sub(r"\\\n\s*", " ", fence.code)
        for line in text.splitlines():
            for part in re.split(r"&&|;|\|\|", line):
                try:
                    words = shlex.split(part, comments=True)
                except ValueError:
                    continue
                while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=value prefixes
                    words = words[1:]
                if words and Path(words[0]).name == "hvdazure":
                    commands.append(words[1:])
    return commands


def command_error(argv: list[str]) -> str | None:
    """None if `hvdazure ARGV` parses, else argparse's one line (nothing is run)."""
    from hvdazure.cli import build_parser

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            if exc.code not in (0, None):
                return err.getvalue().strip() or f"exit status {exc.code}"
    return None
