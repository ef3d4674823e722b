#!/usr/bin/env bash
# The CUDA toolkit a Horovod NCCL build needs, taken from PyPI into the active python's site-packages, for
# the CUDA that python's torch was built with; prints the exports the build needs.
#
#   eval "$(bash scripts/pypi_cuda_toolkit.sh)"     # then: HOROVOD_GPU_OPERATIONS=NCCL bash scripts/build_horovod.sh
#
# PyPI's torch for Linux is a CUDA build whose CUDA libraries are pip packages (torch's metadata pins them,
# through the `cuda-toolkit` metapackage). Adding the compiler wheels of the same release (nvidia-cuda-nvcc,
# -crt, nvidia-nvvm, nvidia-cuda-runtime, -cccl) makes site-packages/nvidia/cu13/ a toolkit with bin/nvcc, no
# GPU and no system CUDA needed. Two symlinks make it look like one to CMake (lib64 -> lib: CMake's CUDA
# detection looks there; lib/libcudart.so -> libcudart.so.13: the wheel has only the versioned name), and a
# third makes torch's NCCL wheel (nccl.h and libnccl.so.2 only) findable by Horovod's FindNCCL
# (libnccl.so -> libnccl.so.2, with HOROVOD_NCCL_LINK=SHARED).
#
# Without network (a GPU machine with a CUDA torch but no index), when the wheels are neither installed nor
# installable, an nvcc of torch's CUDA major version on PATH or in /usr/local/cuda is used instead, and that
# is said on stderr. NCCL always comes from torch's nvidia-nccl wheel: the library torch itself loads.
#
# stdout: `export NAME=VALUE` lines only (and `#` comments), for eval; messages go to stderr.
#   CUDA_HOME, CUDA_PATH, CUDAToolkit_ROOT, HOROVOD_CUDA_HOME   the toolkit's root (nvcc in its bin/)
#   HOROVOD_NCCL_HOME, HOROVOD_NCCL_LINK=SHARED                 torch's NCCL wheel
#   PATH                                                        the toolkit's bin/ first
#   HVDAZURE_CUDA_TOOLKIT_SOURCE                                pypi or system: where the toolkit came from
#
#   PYTHON                  the python whose torch and site-packages are used (default: python on PATH)
#   HVDAZURE_CUDA_TOOLKIT   auto (default: PyPI's wheels, else a system nvcc), pypi (wheels or fail),
#                           system (skip pip: an nvcc on PATH or in /usr/local/cuda)
set -euo pipefail

py=${PYTHON:-python}
mode=${HVDAZURE_CUDA_TOOLKIT:-auto}
say() { echo "[cuda-toolkit] $*" >&2; }
die() { echo "[cuda-toolkit] ERROR: $*" >&2; exit 1; }
[[ $mode =~ ^(auto|pypi|system)$ ]] || die "HVDAZURE_CUDA_TOOLKIT=$mode: expected auto, pypi or system"

# torch's CUDA version, its site-packages, and the toolkit wheels matching its pins, read from package
# metadata (importing torch would load its CUDA libraries: slow, and not needed).
info=$("$py" - <<'PY'
import re
import sys
from importlib import metadata

try:
    dist = metadata.distribution("torch")
except metadata.PackageNotFoundError:
    sys.exit(f"no torch in {sys.executable}: install torch's CUDA build first")
version_py = dist.locate_file("torch/version.py").read_text()
match = re.search(r"^cuda(?:: \S+)? = '([0-9.]+)'", version_py, re.M)
if match is None:
    sys.exit(f"torch {dist.version} in {sys.executable} is not a CUDA build (torch.version.cuda is None)")
cuda = match.group(1)
major_minor = ".".join(cuda.split(".")[:2])
# torch >= 2.10 pins its CUDA through `cuda-toolkit[...]==X`: its nvcc, cccl and cudart extras are the same
# release's compiler (nvcc brings crt, nvvm and the runtime). Older or index-built torches pin the
# nvidia-* wheels directly: then the compiler wheels of torch's CUDA minor release.
toolkit = None
for requirement in dist.requires or []:
    name, _, rest = requirement.partition(";")
    pin = re.fullmatch(r"cuda-toolkit(\[[^\]]*\])?\s*==\s*([0-9.]+)", name.strip())
    if pin and (not rest or "extra" not in rest):
        toolkit = pin.group(2)
if toolkit:
    wheels = [f"cuda-toolkit[nvcc,cccl,cudart]=={toolkit}"]
else:
    wheels = [f"{name}=={major_minor}.*" for name in (
        "nvidia-cuda-nvcc", "nvidia-cuda-crt", "nvidia-nvvm", "nvidia-cuda-runtime", "nvidia-cuda-cccl")]
print(cuda, dist.locate_file(""), dist.version, *wheels)
PY
) || die "cannot read torch's CUDA build from $py (above)"
read -r torch_cuda site torch_version wheels <<<"$info"
read -ra wheels <<<"$wheels"
cuda_major=${torch_cuda%%.*}
nccl=$site/nvidia/nccl
[[ -f $nccl/include/nccl.h && -f $nccl/lib/libnccl.so.2 ]] \
  || die "torch $torch_version has no NCCL wheel in $site/nvidia/nccl (nvidia-nccl-cu$cuda_major): reinstall torch"

nvcc_release() {  # nvcc_release NVCC: "13.0.88" from its --version, or nothing
  "$1" --version 2>/dev/null | sed -n 's/.*release [0-9.]*, V\([0-9.]*\).*/\1/p'
}

nvcc_top() {  # nvcc_top NVCC: the toolkit's root as nvcc itself reports it (right for wrapper scripts too)
  local top
  top=$("$1" -v --dryrun -x cu /dev/null -c -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n1)
  [[ -n $top ]] && (cd "$top" && pwd -P)
}

cuda_home=""
source=""
pypi_home=$site/nvidia/cu$cuda_major
if [[ $mode != system ]]; then
  # Already installed? --no-index answers without the network (a GPU machine may have none).
  if "$py" -m pip install --quiet --no-index "${wheels[@]}" >/dev/null 2>&1; then
    say "PyPI's CUDA $torch_cuda toolkit wheels already installed (${wheels[*]})"
  else
    say "installing PyPI's CUDA toolkit wheels matching torch $torch_version: ${wheels[*]}"
    # pip's status is not what counts: whether the wheels are installed now is (checked next).
    "$py" -m pip install --quiet --retries 2 --timeout 30 "${wheels[@]}" 2>&1 \
      | { grep -v "is ignored: it is neither a file nor a directory" >&2 || true; } || true
    "$py" -m pip install --quiet --no-index "${wheels[@]}" >/dev/null 2>&1 || pypi_failed=1
  fi
  if [[ -z ${pypi_failed:-} && -x $pypi_home/bin/nvcc ]]; then
    cuda_home=$pypi_home
    source=pypi
    # CMake's CUDA detection and FindCUDAToolkit look for lib64/ and for the unversioned libcudart.so.
    [[ -e $cuda_home/lib64 ]] || ln -s lib "$cuda_home/lib64"
    [[ -e $cuda_home/lib/libcudart.so ]] || ln -s "libcudart.so.$cuda_major" "$cuda_home/lib/libcudart.so"
  elif [[ $mode == pypi ]]; then
    die "PyPI's CUDA toolkit wheels (${wheels[*]}) could not be installed into $py (above)"
  else
    say "PyPI's CUDA toolkit wheels could not be installed; looking for a CUDA $cuda_major nvcc on this machine"
  fi
fi
if [[ -z $cuda_home ]]; then
  for nvcc in "$(command -v nvcc || true)" /usr/local/cuda/bin/nvcc; do
    [[ -n $nvcc && -x $nvcc ]] || continue
    release=$(nvcc_release "$nvcc")
    if [[ ${release%%.*} == "$cuda_major" ]]; then
      cuda_home=$(nvcc_top "$nvcc")
      source=system
      say "using this machine's CUDA toolkit at $cuda_home (nvcc $release), not PyPI's wheels"
      break
    fi
    say "skipping $nvcc: CUDA ${release:-of unknown version}, torch needs CUDA $cuda_major"
  done
  [[ -n $cuda_home ]] || die "no CUDA $cuda_major toolkit: PyPI's wheels (${wheels[*]}) are not installable" \
    "and no CUDA $cuda_major nvcc is on PATH or in /usr/local/cuda"
fi

release=$(nvcc_release "$cuda_home/bin/nvcc")
[[ ${release%%.*} == "$cuda_major" ]] \
  || die "$cuda_home/bin/nvcc is CUDA ${release:-of unknown version}; torch $torch_version needs CUDA $cuda_major"
[[ ${release%.*} == "$torch_cuda" ]] || say "note: nvcc $release for torch built with CUDA $torch_cuda"
# Horovod's FindNCCL links libnccl.so (or the static library, which the wheel does not have).
[[ -e $nccl/lib/libnccl.so ]] || ln -s libnccl.so.2 "$nccl/lib/libnccl.so"
say "CUDA toolkit: $cuda_home (nvcc $release, $source); NCCL: $nccl"

q() { printf '%q' "$1"; }
echo "# CUDA $release toolkit ($source) for torch $torch_version; NCCL from $nccl"
for name in CUDA_HOME CUDA_PATH CUDAToolkit_ROOT HOROVOD_CUDA_HOME; do
  echo "export $name=$(q "$cuda_home")"
done
echo "export HOROVOD_NCCL_HOME=$(q "$nccl")"
echo "export HOROVOD_NCCL_LINK=SHARED"
echo "export HVDAZURE_CUDA_TOOLKIT_SOURCE=$source"
echo "export PATH=$(q "$cuda_home/bin"):\"\$PATH\""
