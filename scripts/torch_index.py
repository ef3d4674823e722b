"""Which package index scripts/setup_env.sh should install the pinned PyTorch from, and why.

PyPI's torch wheel for Linux is the CUDA build: several GB with the NVIDIA libraries, wasted on a machine
without an NVIDIA GPU. There, the CPU build comes from PyTorch's own index. In order:

1. HVDAZURE_TORCH_INDEX is set: that index; "pypi" or empty means pip's default index (and configuration).
2. An NVIDIA GPU is present (`nvidia-smi -L` lists one, or /proc/driver/nvidia/gpus has one): the default
   index, whose torch is the CUDA build.
3. A torch satisfying the pin is already at hand (installed, or a wheel in pip's find-links, as on our CI
   machines): the default index. Those machines cannot reach download.pytorch.org, and an unreachable
   extra index does not break pip but costs 5 retries per package looked up: measured here, 8 s more
   for torch alone, and as much again for every other requirement in the same pip command.
4. Otherwise: PyTorch's CPU index as an extra index (its `torch==X+cpu` sorts above PyPI's `torch==X`).

Usage: python scripts/torch_index.py torch==2.13.0
Prints the pip arguments on stdout (nothing, or `--extra-index-url URL`), and the choice and its reason on
stderr. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
OVERRIDE = "HVDAZURE_TORCH_INDEX"


@dataclass(frozen=True)
class Choice:
    """The index to install torch from (None: pip's default) and why, in words for the setup log."""

    index_url: str | None
    reason: str

    def pip_args(self) -> list[str]:
        return ["--extra-index-url", self.index_url] if self.index_url else []


def choose(requirement: str, env: Mapping[str, str], gpu_present: Callable[[], bool],
           available_here: Callable[[str], bool]) -> Choice:
    """The index for `requirement` (e.g. "torch==2.13.0"). The checks are callables, run only if needed."""
    if OVERRIDE in env:
        url = env[OVERRIDE].strip()
        if url in ("", "pypi"):
            return Choice(None, f"from pip's default index: {OVERRIDE}={url!r} says so")
        return Choice(url, f"from {url}: {OVERRIDE} says so")
    if gpu_present():
        return Choice(None, "from pip's default index (the CUDA build): an NVIDIA GPU is present")
    if available_here(requirement):
        return Choice(None, "from the wheel already at hand (installed, or in pip's find-links); "
                            "no other index asked")
    return Choice(CPU_INDEX, f"from {CPU_INDEX} (the CPU build): no NVIDIA GPU here; "
                             f"{OVERRIDE}=pypi takes PyPI's default (CUDA) build")


def nvidia_gpu_present(path: str | None = None, proc_root: Path = Path("/proc")) -> bool:
    """Whether this machine has an NVIDIA GPU with a driver loaded (an installed nvidia-smi alone is not
    enough: containers often carry one without a GPU)."""
    gpus = proc_root / "driver" / "nvidia" / "gpus"
    if gpus.is_dir() and any(gpus.iterdir()):
        return True
    smi = shutil.which("nvidia-smi", path=path)
    if smi is None:
        return False
    try:
        listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listing.returncode == 0 and "GPU " in listing.stdout


def available_here(requirement: str, python: str = sys.executable) -> bool:
    """Whether pip can satisfy `requirement` without any index: already installed, or a local wheel."""
    try:
        dry_run = subprocess.run(
            [python, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps", "--quiet", requirement],
            capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return dry_run.returncode == 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    choice = choose(argv[0], os.environ, nvidia_gpu_present, available_here)
    print(f"[setup] {argv[0]} {choice.reason}", file=sys.stderr)
    print(" ".join(choice.pip_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
