"""`python -m hvdazure.launch.horovodrun ARGS` is `horovodrun ARGS`, with its check that Horovod was built
with Gloo asked once per installation instead of once per job, and the environment's NCCL_SOCKET_IFNAME
left to the ranks (horovodrun puts its own over it).

horovodrun --gloo asks each framework's Horovod extension in turn, TensorFlow's first, whether it was built
with Gloo, in a forked process that imports it: an import of TensorFlow (about 9 s of CPU) before the first
rank of every job starts, PyTorch jobs included. The answer depends only on what is installed, so it is kept
in a small file in hvdazure's cache directory, keyed by Horovod's extension files and the frameworks'
files; a reinstalled Horovod or framework is asked again, and where nothing can be written it is asked
every time, as horovodrun does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

FRAMEWORKS = ("tensorflow", "torch", "mxnet")  # the frameworks whose Horovod extensions horovodrun asks


def cache_file() -> Path:
    """Where the answer is kept: in hvdazure's cache, $HVDAZURE_CACHE (by default ~/.cache/hvdazure, as for
    the wheels scripts/setup_env.sh builds)."""
    cache = os.environ.get("HVDAZURE_CACHE")
    if not cache:
        cache = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hvdazure")
    return Path(cache) / "horovod-gloo-built.json"


def installation_key(horovod_dir: Path) -> str:
    """What the answer depends on: Horovod's compiled extensions and the frameworks they link (each file's
    path, size and mtime; a framework is found without importing it, under whichever distribution name)."""
    files = sorted(horovod_dir.glob("*/mpi_lib*.so"))
    parts = []
    for name in FRAMEWORKS:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            parts.append(f"{name} absent")
        else:
            files.append(Path(spec.origin))
    for path in files:
        stat = path.stat()
        parts.append(f"{path}:{stat.st_size}:{stat.st_mtime_ns}")
    return "\n".join(parts)


def cached_check(check: Callable[..., bool | None], key: str, path: Path) -> Callable[..., bool | None]:
    """`check` answered from `path` when it holds an answer for `key`, else asked and its answer stored."""

    def answer(verbose: bool = False) -> bool | None:
        try:
            stored = json.loads(path.read_text())
            if stored["key"] == key:
                return stored["gloo_built"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
        result = check(verbose=verbose)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            partial.write_text(json.dumps({"key": key, "gloo_built": result}))
            partial.replace(path)  # atomic: jobs starting at once read a whole file or none
        except OSError:
            pass
        return result

    return answer


def keep_the_users_nccl_interface() -> None:
    """horovodrun --gloo starts each rank as `env ENVIRONMENT... NCCL_SOCKET_IFNAME=ITS_INTERFACES COMMAND`:
    its own list (the interfaces it found or was given) over the environment's. Where the environment sets
    NCCL_SOCKET_IFNAME (the user's choice, or hvdazure's: core/nccl_environment.py), the ranks keep that."""
    from horovod.runner import gloo_run

    create = gloo_run.create_run_env_vars

    def create_run_env_vars(*args: Any, **kwargs: Any) -> dict[str, Any]:
        variables = dict(create(*args, **kwargs))
        if "NCCL_SOCKET_IFNAME" in os.environ:
            variables.pop("NCCL_SOCKET_IFNAME", None)
        return variables

    gloo_run.create_run_env_vars = create_run_env_vars


def provide_distutils_spawn() -> None:
    """Horovod 0.28.1's launcher imports `distutils.spawn.find_executable` (for jsrun), and Python 3.12
    removed distutils: where setuptools' stand-in is not installed either, give the launcher the one name it
    uses, as shutil.which (what find_executable does)."""
    try:
        import distutils.spawn  # noqa: F401  (Python 3.11, or setuptools' stand-in)
    except ModuleNotFoundError:
        import shutil
        import types

        package, spawn = types.ModuleType("distutils"), types.ModuleType("distutils.spawn")
        spawn.find_executable = shutil.which  # type: ignore[attr-defined]
        package.spawn = spawn  # type: ignore[attr-defined]
        sys.modules.setdefault("distutils", package)
        sys.modules.setdefault("distutils.spawn", spawn)


def main() -> None:
    import horovod

    provide_distutils_spawn()
    from horovod.runner import launch

    key = installation_key(Path(horovod.__file__).parent)
    launch.gloo_built = cached_check(launch.gloo_built, key, cache_file())
    keep_the_users_nccl_interface()
    sys.argv[0] = "horovodrun"
    sys.exit(launch.run_commandline())


if __name__ == "__main__":
    main()
