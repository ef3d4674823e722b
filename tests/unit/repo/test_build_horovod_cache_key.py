"""scripts/build_horovod.sh --cache-key: the folder a built Horovod wheel is cached in, shared by `make
setup`, `make horovod-gpu` and the GPU check. A CUDA build's folder names its CUDA release, and its key
changes with the release and the architectures; a CUDA build without nvcc is refused with what to run."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "build_horovod.sh"

# What nvcc 13.0.88 (PyPI's nvidia-cuda-nvcc 13.0.88) and 12.9 print for the two questions the script asks.
NVCC_13_VERSION = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0"""
NVCC_13_ARCHS = "compute_75 compute_80 compute_86 compute_87 compute_88 compute_89 compute_90 compute_100 " \
                "compute_110 compute_103 compute_120 compute_121"
NVCC_12_VERSION = """nvcc: NVIDIA (R) Cuda compiler driver
Cuda compilation tools, release 12.9, V12.9.86
Build cuda_12.9.r12.9/compiler.36037853_0"""
NVCC_12_ARCHS = "compute_50 compute_52 compute_53 compute_60 compute_61 compute_62 compute_70 compute_72 " \
                "compute_75 compute_80 compute_86 compute_87 compute_89 compute_90 compute_100 compute_101 " \
                "compute_103 compute_120 compute_121"


def fake_nvcc_home(tmp_path: Path, version: str, archs: str) -> Path:
    """A stand-in for a CUDA toolkit's bin/nvcc (NVIDIA's tool, not ours) that answers --version and
    --list-gpu-arch as the real one does."""
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    arch_lines = "\n".join(archs.split())
    nvcc.write_text(f"""#!/bin/sh
case "$1" in
  --version) cat <<'EOF'
{version}
EOF
  ;;
  --list-gpu-arch) cat <<'EOF'
{arch_lines}
EOF
  ;;
esac
""")
    nvcc.chmod(0o755)
    return home


def cache_key(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "CUDA"))}
    return subprocess.run(["bash", str(SCRIPT), "--cache-key"], capture_output=True, text=True, timeout=120,
                          env={**clean, "PATH": f"{Path(sys.executable).parent}:{clean['PATH']}",
                               "HOROVOD_VERSION": "0.28.1", **env})


def test_a_cpu_build_key_is_stable_and_follows_its_build_settings():
    first, again = cache_key(HOROVOD_WITH_GLOO="1"), cache_key(HOROVOD_WITH_GLOO="1")
    assert first.returncode == 0, first.stderr
    assert re.fullmatch(r"horovod-0\.28\.1-[0-9a-f]{16}\n", first.stdout)
    assert again.stdout == first.stdout
    assert cache_key(HOROVOD_WITHOUT_GLOO="1").stdout != first.stdout


def test_a_cuda_build_key_names_its_cuda_release_and_changes_with_it(tmp_path):
    cuda13 = fake_nvcc_home(tmp_path / "13", NVCC_13_VERSION, NVCC_13_ARCHS)
    cuda12 = fake_nvcc_home(tmp_path / "12", NVCC_12_VERSION, NVCC_12_ARCHS)
    key13 = cache_key(HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_CUDA_HOME=str(cuda13))
    key12 = cache_key(HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_CUDA_HOME=str(cuda12))
    assert key13.returncode == 0, key13.stderr
    assert re.fullmatch(r"horovod-0\.28\.1-cuda13\.0-[0-9a-f]{16}\n", key13.stdout)
    assert re.fullmatch(r"horovod-0\.28\.1-cuda12\.9-[0-9a-f]{16}\n", key12.stdout)
    assert key13.stdout.split("-")[-1] != key12.stdout.split("-")[-1]
    # the architectures are part of the key: an explicit list that differs from the default gives another
    explicit = cache_key(HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_CUDA_HOME=str(cuda13),
                         HOROVOD_BUILD_CUDA_CC_LIST="90")
    default = cache_key(HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_CUDA_HOME=str(cuda13),
                        HOROVOD_BUILD_CUDA_CC_LIST="75,80,86,89,90,100,120")
    assert explicit.stdout != key13.stdout
    assert default.stdout == key13.stdout  # CUDA 13's default list: Volta (70) is gone from nvcc 13
    with_volta = cache_key(HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_CUDA_HOME=str(cuda12),
                           HOROVOD_BUILD_CUDA_CC_LIST="70,75,80,86,89,90,100,120")
    assert with_volta.stdout == key12.stdout  # CUDA 12.9's nvcc still has it


def test_a_cuda_build_without_nvcc_says_what_to_run(tmp_path):
    done = cache_key(HOROVOD_GPU_OPERATIONS="NCCL", HOROVOD_CUDA_HOME=str(tmp_path / "no-cuda"))
    assert done.returncode == 1
    assert done.stderr.startswith("build_horovod.sh: HOROVOD_GPU_OPERATIONS=NCCL needs nvcc, and ")
    assert "scripts/pypi_cuda_toolkit.sh" in done.stderr and done.stdout == ""
