"""Which MPI library mpi4py and Horovod are linked to, read from their compiled extensions, not imported.

`hvdazure sweep` splits the job's ranks into mpi4py sub-communicators and starts Horovod on them, so both
must use one and the same libmpi: a communicator made by one MPI library means nothing to another, and the
result is a crash or a hang, not an error message. PyPI's mpi4py wheels pick an MPI library at run time,
and an mpi4py built elsewhere may be linked to another MPI, so mpi4py is built from source against Horovod's
MPI (`make setup` does it) and checked here.

Importing `mpi4py.MPI` would initialise MPI, so nothing is imported: both packages are found with
importlib.util.find_spec, and `ldd` names the libmpi each extension module is linked to; symlinks are
resolved, so libmpi.so.40 and the libmpi.so.40.30.4 it points to compare equal.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

# requirements/base.txt's pin, for the fix we suggest; tests/unit/launch/test_mpi_libraries.py keeps the two
# equal.
MPI4PY_VERSION = "4.1.2"
# Horovod's extension modules that are linked to libmpi when it was built with MPI, by package subfolder.
HOROVOD_EXTENSIONS = {"torch": "mpi_lib_v2", "tensorflow": "mpi_lib"}

FindSpec = Callable[[str], "importlib.machinery.ModuleSpec | None"]
# The libmpi line of `ldd`: "libmpi.so.40 => /lib/x86_64-linux-gnu/libmpi.so.40 (0x...)", or "=> not found".
LDD_LIBMPI = re.compile(r"^\s*(libmpi\.so[.\d]*)\s+=>\s+(.*?)\s*(?:\(0x[0-9a-f]+\))?\s*$", re.MULTILINE)


@dataclass(frozen=True)
class MpiLibraries:
    """mpi4py's version and the libmpi (a real path) mpi4py and Horovod are linked to: `hvdazure doctor`."""

    mpi4py_version: str | None
    mpi4py_libmpi: str | None
    horovod_libmpi: str | None
    same_library: bool
    problem: str | None  # one line naming what is wrong and the fix; None when hvdazure sweep can run


def rebuild_command() -> str:
    """The command that builds mpi4py against the MPI whose `mpicc` is on PATH (the setup's Open MPI)."""
    mpicc = shutil.which("mpicc") or "mpicc"
    return (f"MPICC={mpicc} pip install --no-binary mpi4py --force-reinstall mpi4py=={MPI4PY_VERSION} "
            "(or `make setup`)")


def libmpi_in_ldd(ldd_output: str) -> tuple[str, str | None] | None:
    """(soname, real path) of the libmpi in `ldd`'s output; the path is None when the loader cannot find it,
    and the whole answer None when nothing links a libmpi."""
    match = LDD_LIBMPI.search(ldd_output)
    if match is None:
        return None
    soname, target = match.groups()
    return soname, (None if target == "not found" else os.path.realpath(target))


def libmpi_problem(mpi4py_libmpi: str, horovod_libmpi: str) -> str | None:
    """None when mpi4py and Horovod are linked to the same libmpi (real paths), else the line that says so."""
    if mpi4py_libmpi == horovod_libmpi:
        return None
    return (f"mpi4py links {mpi4py_libmpi} but Horovod links {horovod_libmpi}; hvdazure sweep needs one MPI "
            f"library for both: rebuild mpi4py against Horovod's MPI: {rebuild_command()}")


def _package_dir(name: str, find_spec: FindSpec) -> Path | None:
    """The folder of an installed package, found without importing it."""
    spec = find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _extension(folder: Path, stem: str) -> Path | None:
    """The compiled module `stem` in `folder` for this interpreter: MPI.cpython-311-x86_64-linux-gnu.so."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if (folder / f"{stem}{suffix}").is_file():
            return folder / f"{stem}{suffix}"
    return None


def _linked_libmpi(library: Path, ldd: str) -> tuple[str, str | None] | None:
    proc = subprocess.run([ldd, str(library)], capture_output=True, text=True, timeout=30)
    return libmpi_in_ldd(proc.stdout)


def _horovod_libmpi(find_spec: FindSpec, ldd: str) -> tuple[str | None, str | None]:
    """(Horovod's libmpi, None) or (None, the problem)."""
    package = _package_dir("horovod", find_spec)
    if package is None:
        return None, "horovod is not installed: run `make setup` (scripts/setup_env.sh)"
    candidates = (_extension(package / sub, stem) for sub, stem in HOROVOD_EXTENSIONS.items())
    extensions = [extension for extension in candidates if extension is not None]
    if not extensions:
        return None, f"horovod in {package} has no compiled framework extension: rebuild it with `make setup`"
    linked = {extension: _linked_libmpi(extension, ldd) for extension in extensions}
    if all(libmpi is None for libmpi in linked.values()):
        return None, ("horovod was built without MPI, and hvdazure sweep runs on MPI: install libopenmpi-dev "
                      "and rebuild it with `make setup`")
    found: set[str] = set()
    for extension, libmpi in linked.items():
        if libmpi is None:
            continue
        name, path = libmpi
        if path is None:
            return None, f"horovod's {extension.name} links {name}, which the loader cannot find"
        found.add(path)
    paths = sorted(found)
    if len(paths) > 1:
        return None, f"horovod's extensions link different MPI libraries ({', '.join(paths)}): rebuild it"
    return paths[0], None


def horovod_libmpi(find_spec: FindSpec = importlib.util.find_spec) -> tuple[str | None, str | None]:
    """(the libmpi Horovod's extensions are linked to, a real path; None) or (None, why there is none)."""
    ldd = shutil.which("ldd")
    if ldd is None:
        return None, "cannot tell which MPI library Horovod loads: `ldd` is not on PATH"
    return _horovod_libmpi(find_spec, ldd)


def _mpi4py_libmpi(find_spec: FindSpec, ldd: str) -> tuple[str | None, str | None]:
    """(mpi4py's libmpi, None) or (None, the problem)."""
    package = _package_dir("mpi4py", find_spec)
    if package is None:
        return None, ("mpi4py is not installed; hvdazure sweep needs it built against Horovod's MPI: "
                      f"{rebuild_command()}")
    extension = _extension(package, "MPI")
    if extension is None:
        if any(package.glob("MPI.*.so")):  # MPI.openmpi.*.so, MPI.mpich.*.so: one per MPI ABI
            return None, ("mpi4py is PyPI's binary wheel, which picks an MPI library at run time; hvdazure "
                          f"sweep needs it built against Horovod's MPI: {rebuild_command()}")
        return None, f"mpi4py in {package} has no compiled MPI module: {rebuild_command()}"
    libmpi = _linked_libmpi(extension, ldd)
    if libmpi is None:
        return None, f"mpi4py's {extension.name} links no libmpi: {rebuild_command()}"
    if libmpi[1] is None:
        return None, f"mpi4py links {libmpi[0]}, which the loader cannot find (LD_LIBRARY_PATH?)"
    return libmpi[1], None


def mpi_libraries(find_spec: FindSpec = importlib.util.find_spec) -> MpiLibraries:
    """What `hvdazure doctor` reports about mpi4py; `find_spec` stands in for importlib's in tests."""
    version = _installed_version("mpi4py") if find_spec("mpi4py") is not None else None
    ldd = shutil.which("ldd")
    if ldd is None:
        return MpiLibraries(version, None, None, False,
                            "cannot tell which MPI library mpi4py and Horovod load: `ldd` is not on PATH")
    mpi4py_libmpi, mpi4py_side = _mpi4py_libmpi(find_spec, ldd)
    horovod_libmpi, horovod_side = _horovod_libmpi(find_spec, ldd)
    # mpi4py's problem first: Horovod's own are also what `hvdazure doctor` reports from its build check.
    problem = mpi4py_side or horovod_side
    if problem is None and mpi4py_libmpi and horovod_libmpi:
        problem = libmpi_problem(mpi4py_libmpi, horovod_libmpi)
    same = mpi4py_libmpi is not None and mpi4py_libmpi == horovod_libmpi
    return MpiLibraries(version, mpi4py_libmpi, horovod_libmpi, same, problem)


def _installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:  # importable from a source tree, without metadata
        return None


def mpi4py_problem(find_spec: FindSpec = importlib.util.find_spec) -> str | None:
    """None when mpi4py is installed and linked to Horovod's libmpi; otherwise one line: the problem and
    its fix. `hvdazure sweep` calls this before it launches anything."""
    return mpi_libraries(find_spec).problem
