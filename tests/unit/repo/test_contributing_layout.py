"""CONTRIBUTING.md's layout tree against the repository: every module and package of `hvdazure/`, and every
file or folder at the top of `scripts/`, `docker/` and `benchmarks/`, has its line, and every line names
something that exists.

The tree is the first fenced block under "## How the code is laid out": one entry a line, its depth given by
two spaces of indentation, a folder's name ending in `/`, then what it owns. What the repository holds is
what git holds or would hold (tracked, or untracked and not ignored), so that a module added but not yet
committed counts and a build folder or ignored results folder does not.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
HEADING = "## How the code is laid out"
CHECKED_WHOLE = "hvdazure"  # every module (but __init__.py) and every package, at every depth
CHECKED_TOP = ("scripts", "docker", "benchmarks")  # every file and folder directly inside


def tree_entries(text: str) -> list[str]:
    """The repository paths the layout tree lists (a folder with a trailing `/`), in order."""
    section = text.split(HEADING, 1)[1]
    block = re.search(r"^```\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert block, f"CONTRIBUTING.md: no fenced tree block under {HEADING!r}"
    paths: list[str] = []
    parents: list[str] = []
    for number, line in enumerate(block.group(1).splitlines(), 1):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        assert indent % 2 == 0 and indent // 2 <= len(parents), \
            f"CONTRIBUTING.md's tree, line {number} ({line.strip()!r}): indented by {indent} spaces"
        del parents[indent // 2:]
        name = line.split()[0]
        path = "".join(parents) + name
        paths.append(path)
        if name.endswith("/"):
            parents.append(name)
    return paths


def repository_files() -> list[str]:
    """Every file git holds or would hold under the checked folders (tracked, or untracked and not ignored),
    that exists in the working tree."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: which files are ignored is git's to say")
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--",
                             CHECKED_WHOLE, *CHECKED_TOP], cwd=ROOT, capture_output=True, text=True,
                            check=True, timeout=60).stdout
    return sorted({path for path in listed.split("\0") if path and (ROOT / path).is_file()})


def expected_entries(files: list[str]) -> set[str]:
    """The tree's lines the files call for: hvdazure's modules (not __init__.py) and packages, and the
    top-level files and folders of scripts/, docker/ and benchmarks/ (with the checked folders themselves)."""
    expected = {f"{top}/" for top in (CHECKED_WHOLE, *CHECKED_TOP)}
    for path in files:
        parts = path.split("/")
        if parts[0] == CHECKED_WHOLE:
            if path.endswith(".py") and "__pycache__" not in parts:
                if parts[-1] != "__init__.py":
                    expected.add(path)
                expected.update("/".join(parts[:depth]) + "/" for depth in range(1, len(parts)))
        else:
            expected.add(f"{parts[0]}/{parts[1]}" + ("/" if len(parts) > 2 else ""))
    return expected


def test_the_layout_tree_lists_every_module_and_only_what_exists():
    listed = tree_entries(CONTRIBUTING.read_text())
    expected = expected_entries(repository_files())

    twice = sorted({path for path in listed if listed.count(path) > 1})
    missing = sorted(expected - set(listed))
    gone = sorted(path for path in listed if not (ROOT / path).exists())
    problems = [f"missing from CONTRIBUTING.md's layout tree: {', '.join(missing)}" if missing else "",
                f"listed in CONTRIBUTING.md's layout tree but not in the repository: {', '.join(gone)}"
                if gone else "",
                f"listed twice in CONTRIBUTING.md's layout tree: {', '.join(twice)}" if twice else ""]
    assert not any(problems), "; ".join(p for p in problems if p)


def test_the_tree_parser_reads_depth_from_indentation_and_folders_from_the_slash():
    tree = ["pkg/     what", "  a.py   a", "  sub/   s", "    b.py b", "", "  c.py   c", "top.env t"]
    text = "\n".join([HEADING, "", "prose", "", "```", *tree, "```", "", "```", "not/  read", "```", ""])

    assert tree_entries(text) == ["pkg/", "pkg/a.py", "pkg/sub/", "pkg/sub/b.py", "pkg/c.py", "top.env"]


def test_expected_entries_are_modules_packages_and_top_level_entries():
    files = ["hvdazure/__init__.py", "hvdazure/cli.py", "hvdazure/core/__init__.py", "hvdazure/core/x.py",
             "hvdazure/core/environments/azureml.py", "scripts/setup_env.sh", "scripts/gpu_check/job.py",
             "docker/cpu/Dockerfile", "benchmarks/RESULTS.md", "hvdazure/py.typed"]

    assert expected_entries(files) == {
        "hvdazure/", "scripts/", "docker/", "benchmarks/", "hvdazure/cli.py", "hvdazure/core/",
        "hvdazure/core/x.py", "hvdazure/core/environments/", "hvdazure/core/environments/azureml.py",
        "scripts/setup_env.sh", "scripts/gpu_check/", "docker/cpu/", "benchmarks/RESULTS.md"}
