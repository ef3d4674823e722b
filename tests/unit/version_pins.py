"""The repository's pins, read once for every test that checks a copy of them: versions.env (the one place
every pinned version lives), requirements/*.txt and setup.py's literal arguments. Beside the unit tests'
conftest.py so that tests of any folder (tests/unit/repo/, tests/unit/launch/, tests/integration/) import it
as `version_pins`."""

import ast
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def read_versions_env() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "versions.env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            pins[key.strip()] = value.strip()
    return pins



def requirement_pins(path: Path) -> dict[str, str]:
    """name -> pinned version, following `-r other.txt` includes."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r"):
            pins |= requirement_pins(path.parent / line[2:].strip())
        elif line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            pins[requirement.name.lower()] = spec.version
    return pins


def setup_py_arguments() -> dict:
    """The literal arguments of setup.py's setup(...) call, read without running it."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(node for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup")
    arguments = {}
    for keyword in call.keywords:
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except ValueError:
            continue  # computed arguments (version, long_description) say nothing about pins
    return arguments
