"""Which controller a job runs on when none is asked for (`hvdazure run` and `hvdazure bench` without
--gloo or --mpi): MPI wherever it can run, else Gloo.

Measured with `hvdazure bench peers -np 2` (benchmarks/RESULTS.md): on one machine Horovod's MPI
controller exchanges gradients through shared memory and coordinates the ranks with MPI calls, where its
Gloo controller sends both over TCP and negotiates over it every millisecond; hvdazure on MPI trains the
latency-bound model 1.46x as fast as on Gloo and 1.36x as fast as torchrun + DDP (Gloo: 0.89x). MPI
can run where `mpirun` is on PATH and Horovod's compiled extensions are linked to a libmpi of the same MPI
(Open MPI's libmpi.so.40 with Open MPI's mpirun, or another MPI's with its own); nothing is started or
imported to find out (launch/mpi_libraries.py reads the links with `ldd`). Gloo needs nothing but Horovod.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from collections.abc import Callable

from hvdazure.launch.mpi_libraries import FindSpec, horovod_libmpi

OPEN_MPI_SONAME = "libmpi.so.40"  # Open MPI's libmpi since 3.0; MPICH's and Intel MPI's is libmpi.so.12


def mpi_version(which: Callable[[str], str | None] = shutil.which) -> str | None:
    """First line of `mpirun --version`, e.g. 'mpirun (Open MPI) 4.1.4'; None without mpirun."""
    exe = which("mpirun")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return lines[0] if lines else None


def mpi_unusable(find_spec: FindSpec = importlib.util.find_spec,
                 which: Callable[[str], str | None] = shutil.which) -> str | None:
    """Why the MPI controller cannot run here, in a few words; None when it can."""
    version = mpi_version(which)
    if version is None:
        return "mpirun is not on PATH"
    libmpi, problem = horovod_libmpi(find_spec)
    if libmpi is None:
        return problem
    open_mpi_run, open_mpi_lib = "Open MPI" in version, libmpi.rsplit("/", 1)[-1].startswith(OPEN_MPI_SONAME)
    if open_mpi_run != open_mpi_lib:
        return f"Horovod is linked to {libmpi}, another MPI than {version}'s"
    return None


def default_controller(find_spec: FindSpec = importlib.util.find_spec,
                       which: Callable[[str], str | None] = shutil.which) -> str:
    """"mpi" where the MPI controller can run, else "gloo"."""
    return "gloo" if mpi_unusable(find_spec, which) else "mpi"
