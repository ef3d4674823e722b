"""`hvdazure doctor`: what this machine can run, what is missing, and how to fix it.

Versions are read from package metadata (no framework import), torch's CUDA version from its version.py;
Horovod's build from its framework extensions, each asked in one process of its own (`horovod_build`), and the
GPUs a CUDA torch sees in one more (`torch_gpu_count`), all at once; mpi4py's MPI library from its extension
module, without importing it (launch/mpi_libraries.py).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from hvdazure._version import __version__
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
    torch_cuda: str | None = None  # the CUDA torch was compiled with (torch.version.cuda); None: a CPU build
    torch_gpus: int | None = None  # torch.cuda.device_count() if torch.cuda.is_available(); None: not asked
    notes: list[str] = field(default_factory=list)  # worth knowing, not wrong: no verdict depends on them

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


# Horovod's build, as `horovodrun --check-build` reports it, asked of each framework's extension directly:
# check-build forks a process per question, each importing the first framework it finds again (a dozen
# TensorFlow imports, ~30 s on 2 cores); one process per framework answers every question (~5 s).
FRAMEWORKS = (("TensorFlow", "tensorflow", "tensorflow"), ("PyTorch", "torch", "torch"),
              ("MXNet", "mxnet", "mxnet"))  # check-build's order: (name, horovod's extension, distribution)
OPERATIONS = (("NCCL", "nccl"), ("DDL", "ddl"), ("CCL", "ccl"), ("MPI", "mpi"), ("Gloo", "gloo"))
_PROBE = """
import json, sys
try:
    ext = __import__("horovod." + sys.argv[1], fromlist=["mpi_built"])
    answer = {name: bool(getattr(ext, name + "_built")()) for name in sys.argv[2:]}
except Exception as error:
    answer = {"error": f"{type(error).__name__}: {error}".splitlines()[0]}
print(json.dumps(answer))
"""
_PROBE_TIMEOUT_S = 120


def build_from_answers(answers: dict[str, dict[str, Any]]) -> HorovodBuild:
    """Horovod's build from each framework's answers (framework name -> {"mpi": True, ...} or {"error":
    ...}): the frameworks whose extension loads; controllers and operations as the first of them (in
    check-build's order) says, as check-build reads them."""
    build = HorovodBuild()
    for name, _, _ in FRAMEWORKS:
        if name in answers and "error" not in answers[name]:
            build.frameworks.append(name)
    if build.frameworks:
        first = answers[build.frameworks[0]]
        build.controllers = [name for name, key in (("MPI", "mpi"), ("Gloo", "gloo")) if first[key]]
        build.tensor_operations = [name for name, key in OPERATIONS if first[key]]
    return build


def horovod_build(packages: dict[str, str | None]) -> tuple[HorovodBuild | None, str | None]:
    """Horovod's compiled features, or None and the reason they could not be read. `packages`: installed
    versions by distribution; only the frameworks installed are asked, all at once."""
    keys = [key for _, key in OPERATIONS]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}  # TensorFlow's start-up notices are not the report
    probes = {name: subprocess.Popen([sys.executable, "-c", _PROBE, extension, *keys], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
              for name, extension, dist in FRAMEWORKS if packages.get(dist)}
    answers: dict[str, dict[str, Any]] = {}
    for name, proc in probes.items():
        try:
            out, _ = proc.communicate(timeout=_PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            answers[name] = {"error": f"no answer within {_PROBE_TIMEOUT_S} s"}
            continue
        try:
            answers[name] = json.loads(out.strip().splitlines()[-1])
        except (IndexError, ValueError):
            answers[name] = {"error": f"the process ended with exit code {proc.returncode} and no answer"}
    build = build_from_answers(answers)
    if not build.frameworks:
        why = "; ".join(f"horovod.{ext}: {answers[name]['error']}" for name, ext, _ in FRAMEWORKS
                        if name in answers) or "neither torch nor tensorflow is installed"
        return None, f"no Horovod framework extension loads ({why}): {SETUP_HINT}"
    return build, None


def torch_cuda_version(packages: dict[str, str | None]) -> str | None:
    """torch.version.cuda, read from torch/version.py without importing torch (which would load its CUDA
    libraries); None for a CPU build or without torch."""
    if not packages.get("torch"):
        return None
    try:
        version_py = Path(str(metadata.distribution("torch").locate_file("torch/version.py"))).read_text()
    except (OSError, metadata.PackageNotFoundError):
        return None
    match = re.search(r"^cuda(?:: \S+)? = '([0-9.]+)'", version_py, re.MULTILINE)
    return match.group(1) if match else None


_TORCH_GPUS = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"


def start_torch_gpu_count() -> subprocess.Popen[str]:
    """Ask a CUDA torch, in a process of its own, how many GPUs it can use (`torch_gpu_count` reads the
    answer): importing torch takes seconds, so it runs while Horovod's extensions are asked."""
    return subprocess.Popen([sys.executable, "-c", _TORCH_GPUS], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def torch_gpu_count(proc: subprocess.Popen[str]) -> int | None:
    """The answer of `start_torch_gpu_count`; None when torch gave none in time."""
    try:
        out, _ = proc.communicate(timeout=_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    try:
        return int(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None


def gpu_notes(torch_cuda: str | None, torch_gpus: int | None, build: HorovodBuild | None) -> list[str]:
    """What a machine without a GPU means for a CUDA build of torch (and a Horovod built with NCCL): worth a
    line, not a problem, since such a build also trains on the CPU (a GPU environment built or checked on a
    machine without one, or a GPU image started without `--gpus`)."""
    if torch_cuda is None or torch_gpus is None or torch_gpus > 0:
        return []
    nccl = build is not None and "NCCL" in build.tensor_operations
    unused = "; horovod's NCCL operations are built but unused here (CPU tensors go through MPI or Gloo)"
    return [f"no GPU visible: torch is compiled with CUDA {torch_cuda} but torch.cuda.is_available() is "
            f"False, so training runs on the CPU{unused if nccl else ''}"]


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
    torch_cuda = torch_cuda_version(packages)
    gpu_count = start_torch_gpu_count() if torch_cuda else None
    build, build_problem = horovod_build(packages) if packages["horovod"] else (None, None)
    torch_gpus = torch_gpu_count(gpu_count) if gpu_count else None
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
                            "host memory; use a docker/*-gpu image or build with HOROVOD_GPU_OPERATIONS=NCCL")
    if mpi is None:
        problems.append("mpirun not found: install Open MPI (apt-get install openmpi-bin libopenmpi-dev)")
    notes = gpu_notes(torch_cuda, torch_gpus, build)
    missing_problems, missing_notes = missing_frameworks(packages)
    problems += missing_problems
    notes += missing_notes
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
        torch_cuda=torch_cuda,
        torch_gpus=torch_gpus,
        notes=notes,
    )


def missing_frameworks(packages: dict[str, str | None]) -> tuple[list[str], list[str]]:
    """(problems, notes) for torch and tensorflow not installed: a problem where neither is, a note where the
    other one is, since one framework per environment is how the GPU environments are (their CUDA lines
    differ: docs/guides/gpus.md)."""
    problems: list[str] = []
    notes: list[str] = []
    frameworks = ("torch", "tensorflow")
    for dist in frameworks:
        if packages.get(dist) is None:
            others = [other for other in frameworks if other != dist and packages.get(other)]
            if others:
                notes.append(f"{dist} is not installed: hvdazure.{dist} is unavailable (a {others[0]}-only "
                             "environment)")
            else:
                problems.append(f"{dist} is not installed: hvdazure.{dist} is unavailable ({SETUP_HINT})")
    return problems, notes


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

    def show_gpus(count: int | None) -> str:
        return "GPUs torch sees: unknown" if count is None else f"GPUs torch sees: {count}"

    build = report.horovod_build
    lines = [
        f"hvdazure     {report.hvdazure}",
        f"python       {report.python}",
        f"platform     {report.platform}",
        *(f"{name:<12} {show(version)}" for name, version in report.packages.items()),
        f"mpi          {show(report.mpi)}",
        *([f"mpi4py       {describe_mpi4py(report.mpi4py)}"] if report.mpi4py else []),
        *([f"torch cuda   {report.torch_cuda} (compiled with), {show_gpus(report.torch_gpus)}"]
          if report.torch_cuda else []),
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
    if report.notes:
        lines.append("notes:")
        lines += [f"  - {note}" for note in report.notes]
    if report.problems:
        lines.append("problems:")
        lines += [f"  - {problem}" for problem in report.problems]
    lines.append("verdict: horovod can run" if report.ok else "verdict: horovod cannot run (see problems)")
    return "\n".join(lines)
