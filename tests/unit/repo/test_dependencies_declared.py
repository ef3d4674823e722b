"""Every third-party module hvdazure imports is declared in setup.py: a `pip install hvdazure` (with the
extras its features name) must not fail later with a ModuleNotFoundError."""

import ast
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from version_pins import setup_py_arguments

PACKAGE = Path(__file__).resolve().parents[3] / "hvdazure"
# Built from source by scripts/build_horovod.sh, not installable from PyPI as is (see setup.py).
NOT_ON_PYPI = {"horovod"}


def imported_top_level_modules() -> set[str]:
    """Top-level names of every absolute import in the package, wherever it sits (lazy imports too)."""
    modules = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"hvdazure", "__future__"}


def names(specs: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(spec).name) for spec in specs}


def declared_distributions() -> set[str]:
    arguments = setup_py_arguments()
    extras = [spec for extra in arguments["extras_require"].values() for spec in extra]
    return names(arguments["install_requires"]) | names(extras)


def test_every_third_party_import_is_declared_in_install_requires_or_an_extra():
    provided_by = packages_distributions()
    declared = declared_distributions()

    for module in sorted(imported_top_level_modules() - NOT_ON_PYPI):
        # A distribution named like the module counts too: tensorflow-cpu provides `tensorflow` here.
        distributions = {canonicalize_name(d) for d in [module, *provided_by.get(module, [])]}
        assert distributions & declared, f"{module} ({sorted(distributions)}) is not in setup.py"


def test_abfs_checkpoints_come_with_the_azure_extra():
    assert "adlfs" in names(setup_py_arguments()["extras_require"]["azure"])
