"""`hvdazure doctor`: what this machine can run, what is missing, and how to fix it.

Versions are read from package metadata (no framework import); Horovod's build is read from
`horovodrun --check-build`, the same report Horovod's own docs point to; mpi4py's MPI library from its
extension module, without importing it (launch/mpi_libraries.py).
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata

from hvdazure._version import __version__
from hvdazure.launch.command import find_executable
from hvdazure.launch.controller import mpi_unusable, mpi_version
from hvdazure.launch.mpi_libraries import MpiLibraries, mpi_libraries

SETUP_HINT = "run `make setup` (scripts/setup_env.sh) from the hvdazure repository"


@dataclass
class HorovodBuild:
    """Which frameworks, controllers and tensor operations Horovod was compiled with."""

    frameworks: list[str] = field(default_factory=list)
    controllers: list[str] = field(default_factory=list)
    tensor_operations: list[str] = field(default_factory=list)


@dataclass
class Report:
    python: str
    platform: str
    hvdazure: str
    packages: dict[str, str | None]
    horovod_build: HorovodBuild | None
    mpi: str | None
    gpus: list[str]
    problems: list[str]
    mpi4py: MpiLibraries | None = None  # hvdazure sweep needs mpi4py linked to Horovod's libmpi
    controller: str = ""  # what `hvdazure run` uses without --gloo / --mpi, and why

    @property
    def ok(self) -> bool:
        """Horovod can run at least one framework over at least one controller."""
        build = self.horovod_build
        return bool(build and build.frameworks and build.controllers)


def package_version(name: str) -> str | None:
    """Installed version of a distribution, or None (tensorflow ships as tensorflow or tensorflow-cpu)."""
    candidates = {"tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-gpu")}.get(name, (name,))
    for dist in candidates:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def parse_check_build(text: str) -> HorovodBuild:
    """Parse the `[X] Name` lines of `horovodrun --check-build` into its three sections."""
    build = HorovodBuild()
    section: list[str] | None = None
    for line in text.splitlines():
        heading = line.strip().lower()
        if heading.startswith("available frameworks"):
            section = build.frameworks
        elif heading.startswith("available controllers"):
            section = build.controllers
        elif heading.startswith("available tensor operations"):
            section = build.tensor_operations
        elif section is not None and (match := re.match(r"\s*\[X\]\s+(\S+)", line)):
            section.append(match.group(1))
    return build


def horovod_build() -> tuple[HorovodBuild | None, str | None]:
    """Horovod's compiled features, or None and the reason it could not be read."""
    exe = find_executable("horovodrun")
    if exe is None:
        return None, f"horovod is not installed; {SETUP_HINT}"
    try:
        proc = subprocess.run([exe, "--check-build"], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None, "`horovodrun --check-build` did not answer within 120 s"
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"`horovodrun --check-build` failed: {last[0]}"
    return parse_check_build(proc.stdout), None


def visible_gpus() -> list[str]:
    """GPUs as `nvidia-smi -L` lists them; none on a machine without the NVIDIA driver."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        proc = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return []
    return [line.strip() for line in proc.stdout.splitlines() if line.startswith("GPU")]


def collect() -> Report:
    """Everything `hvdazure doctor` prints."""
    packages = {name: package_version(name) for name in ("torch", "tensorflow", "horovod", "azure-ai-ml")}
    build, build_problem = horovod_build() if packages["horovod"] else (None, None)
    mpi = mpi_version()
    gpus = visible_gpus()
    libraries = mpi_libraries()
    problems = []
    if packages["horovod"] is None:
        problems.append(f"horovod is not installed: {SETUP_HINT}")
    elif build_problem:
        problems.append(build_problem)
    if build is not None:
        for framework, dist in (("PyTorch", "torch"), ("TensorFlow", "tensorflow")):
            if packages[dist] and framework not in build.frameworks:
                problems.append(f"horovod was built without {framework} although {dist} is installed; "
                                f"rebuild it: {SETUP_HINT}")
        if "MPI" not in build.controllers:
            problems.append("horovod was built without MPI: `hvdazure run --mpi` and mpirun jobs will fail; "
                            "install libopenmpi-dev and rebuild")
        if "Gloo" not in build.controllers:
            problems.append("horovod was built without Gloo: `hvdazure run --gloo` will fail; rebuild with "
                            "HOROVOD_WITH_GLOO=1")
        # A Horovod that is missing or lacks MPI is reported above; the mpi4py line would repeat it.
        if "MPI" in build.controllers and libraries.problem:
            problems.append(libraries.problem)
        if gpus and "NCCL" not in build.tensor_operations:
            problems.append("GPUs are visible but horovod has no NCCL operations: GPU allreduce goes through "
                            "host memory; use the docker/gpu image or build with HOROVOD_GPU_OPERATIONS=NCCL")
    if mpi is None:
        problems.append("mpirun not found: install Open MPI (apt-get install openmpi-bin libopenmpi-dev)")
    for dist in ("torch", "tensorflow"):
        if packages[dist] is None:
            problems.append(f"{dist} is not installed: hvdazure.{dist} is unavailable ({SETUP_HINT})")
    return Report(
        python=f"{platform.python_version()} ({sys.executable})",
        platform=platform.platform(),
        hvdazure=__version__,
        packages=packages,
        horovod_build=build,
        mpi=mpi,
        gpus=gpus,
        problems=problems,
        mpi4py=libraries,
        controller=describe_default_controller(),
    )


def describe_default_controller() -> str:
    """The controller `hvdazure run` picks without --gloo / --mpi, and why (launch/controller.py)."""
    why = mpi_unusable()
    return "MPI (mpirun; --gloo for Gloo)" if why is None else f"Gloo ({why}; MPI would be faster)"


def as_dict(report: Report) -> dict:
    """The report as JSON-ready data, with the overall verdict under "ok"."""
    return {**asdict(report), "ok": report.ok}


def describe_mpi4py(libraries: MpiLibraries) -> str:
    """mpi4py's version and MPI library, and whether it is Horovod's."""
    if libraries.mpi4py_version is None:
        return "not installed"
    if libraries.mpi4py_libmpi is None:
        return f"{libraries.mpi4py_version}, MPI library unknown"
    verdict = "Horovod's too" if libraries.same_library else f"not Horovod's {libraries.horovod_libmpi}"
    return f"{libraries.mpi4py_version} with {libraries.mpi4py_libmpi} ({verdict})"


def format_report(report: Report) -> str:
    """The human-readable report."""
    def show(value: object) -> str:
        return str(value) if value else "not installed"

    build = report.horovod_build
    lines = [
        f"hvdazure     {report.hvdazure}",
        f"python       {report.python}",
        f"platform     {report.platform}",
        *(f"{name:<12} {show(version)}" for name, version in report.packages.items()),
        f"mpi          {show(report.mpi)}",
        *([f"mpi4py       {describe_mpi4py(report.mpi4py)}"] if report.mpi4py else []),
        f"gpus         {', '.join(report.gpus) or 'none visible'}",
        *([f"controller   {report.controller}"] if report.controller else []),
    ]
    if build is not None:
        lines += [
            "horovod build:",
            f"  frameworks         {', '.join(build.frameworks) or 'none'}",
            f"  controllers        {', '.join(build.controllers) or 'none'}",
            f"  tensor operations  {', '.join(build.tensor_operations) or 'none'}",
        ]
    lines.append("")
    if report.problems:
        lines.append("problems:")
        lines += [f"  - {problem}" for problem in report.problems]
    lines.append("verdict: horovod can run" if report.ok else "verdict: horovod cannot run (see problems)")
    return "\n".join(lines)
