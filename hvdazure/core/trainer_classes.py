"""A training script's trainer class, found without running its training (what `hvdazure export` builds
the model with).

The script is imported as a module named `__hvdazure_script__`, not run as `__main__`: its
`if __name__ == "__main__":` block (`MyTrainer.main()`, or a `fit()` of its own) does not run, so only
what its top level does happens (imports, definitions). As under `python train.py`, its own folder comes
first on sys.path (the modules beside it import, now and from its hooks later) and sys.argv holds only
its path while it is imported. Its trainer is the subclass of TorchTrainer or TensorFlowTrainer, defined
there or imported, that no other one in it extends: exactly one, or the one `--trainer` names.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from hvdazure.core.config import ConfigError
from hvdazure.core.trainer import Trainer

SCRIPT_MODULE = "__hvdazure_script__"


def trainer_class_in(script: str, name: str | None = None) -> type[Trainer]:
    """The trainer class of `script` (a path), the one named `name` if given; a ConfigError naming the
    script and the classes it has when there is none, several, or none of that name."""
    found = trainer_classes(_imported(script))
    if name is not None:
        if name not in found:
            raise ConfigError(f"--trainer {name!r}: {script} has no trainer class of that name "
                              f"({_listed(found)})")
        return found[name]
    leaves = {n: c for n, c in found.items()
              if not any(other is not c and issubclass(other, c) for other in found.values())}
    if len(leaves) == 1:
        return next(iter(leaves.values()))
    if not leaves:
        raise ConfigError(f"{script} has no trainer class: define a subclass of TorchTrainer or "
                          "TensorFlowTrainer at its top level (not inside `if __name__ == \"__main__\":`)")
    raise ConfigError(f"{script} has several trainer classes ({_listed(leaves)}): choose one with --trainer "
                      "NAME")


def trainer_classes(module: object) -> dict[str, type[Trainer]]:
    """The user's Trainer subclasses a module holds at its top level, by class name (hvdazure's own aside)."""
    found: dict[str, type[Trainer]] = {}
    for value in vars(module).values():
        if isinstance(value, type) and issubclass(value, Trainer) and \
                value.__module__.partition(".")[0] != "hvdazure":
            found.setdefault(value.__name__, value)
    return found


def _listed(classes: dict[str, type[Trainer]]) -> str:
    return f"it has {', '.join(sorted(classes))}" if classes else "it has none"


def _imported(script: str) -> object:
    """`script` executed as the module SCRIPT_MODULE (registered in sys.modules, as an import would)."""
    path = Path(script)
    if not path.is_file():
        raise ConfigError(f"script {script!r} not found" if not path.exists() else
                          f"script {script!r} is not a file")
    spec = importlib.util.spec_from_file_location(SCRIPT_MODULE, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"script {script!r} cannot be imported: give a .py file")
    module = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    saved_argv = sys.argv
    sys.argv, sys.modules[SCRIPT_MODULE] = [str(path)], module
    try:
        spec.loader.exec_module(module)
    except SystemExit as exc:  # argparse or sys.exit at the top level: the script's own usage is no answer
        del sys.modules[SCRIPT_MODULE]
        raise ConfigError(f"script {script!r} exited (status {exc.code!r}) as it was imported: hvdazure "
                          "imports it without running its `if __name__ == \"__main__\":` block, so move "
                          "what parses the command line or exits there") from None
    except BaseException:
        del sys.modules[SCRIPT_MODULE]
        raise
    finally:
        sys.argv = saved_argv
    return module
