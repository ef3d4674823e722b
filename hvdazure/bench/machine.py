"""The facts about this machine a benchmark's figures depend on, recorded with every result."""

from __future__ import annotations

import os
import platform
import socket
import time
from pathlib import Path

from hvdazure import doctor
from hvdazure.launch.controller import mpi_version


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def threads_per_rank(num_proc: int) -> int:
    """The threads each of `num_proc` processes on this machine computes with: its usable cores / N (at
    least 1), so that a rank is the same unit however many run."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // num_proc)


def memory_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.virtual_memory().total)
    except ImportError:
        return None


def facts(controller: str, command: list[str]) -> dict:
    """CPU, cores, memory, GPUs, versions, the controller, the exact command and the load right now."""
    versions = {name: doctor.package_version(name)
                for name in ("torch", "tensorflow", "horovod", "mpi4py", "numpy")}
    return {
        "host": socket.gethostname(),
        "started_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_bytes": memory_bytes(),
        "gpus": doctor.visible_gpus(),
        "python": platform.python_version(),
        "versions": versions,
        "mpi": mpi_version(),
        "controller": controller,
        "command": command,
        "load_average_at_start": list(os.getloadavg()),
    }
