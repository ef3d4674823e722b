#!/usr/bin/env bash
# Horovod for PyTorch built with NCCL (plus MPI and Gloo) against PyPI's CUDA build of torch, in a venv of its
# own, on any Linux x86-64 machine: no GPU and no system CUDA needed (`make horovod-gpu`).
#
# PyPI's torch for Linux is a CUDA build whose CUDA libraries and NCCL are pip packages; the CUDA compiler comes
# from PyPI too (scripts/pypi_cuda_toolkit.sh). The steps: the venv with torch==TORCH_VERSION (CUDA
# TORCH_CUDA_VERSION, NCCL TORCH_NCCL_VERSION: versions.env), requirements/base.txt (mpi4py compiled against
# this machine's Open MPI, as in setup_env.sh) and hvdazure (editable); the toolkit; Horovod, built by
# scripts/build_horovod.sh and cached as a wheel under $HVDAZURE_CACHE/wheels/ (keyed by CUDA release, NCCL,
# torch, python, MPI and the build recipe: a second run installs the cached wheel); then `hvdazure doctor` and
# horovod.torch's NCCL check. The project's own .venv (CPU torch, TensorFlow) is not touched: one environment
# cannot hold torch's CUDA 13 NCCL and TensorFlow's CUDA 12 one (docs/guides/gpus.md).
#
#   HVDAZURE_CACHE     where the venv and the wheels go (default: ~/.cache/hvdazure)
#   HVDAZURE_GPU_VENV  the venv (default: $HVDAZURE_CACHE/venv-torch-cu<TORCH_CUDA_VERSION without the dot>)
#   PYTHON             the interpreter to create it with (default: python$PYTHON_VERSION, else python3)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
set -a; . ./versions.env; set +a
cache=${HVDAZURE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdazure}
venv=${HVDAZURE_GPU_VENV:-$cache/venv-torch-cu${TORCH_CUDA_VERSION//./}}
say() { echo "[horovod-gpu] $*"; }
die() { echo "[horovod-gpu] ERROR: $*" >&2; exit 1; }
started=$(date +%s)

for tool in mpicc cmake g++ make; do
  command -v "$tool" >/dev/null || die "$tool not found: run \`make setup\` (or apt-get install openmpi-bin" \
    "libopenmpi-dev cmake g++ make)"
done

python_bin=${PYTHON:-$(command -v "python${PYTHON_VERSION}" || command -v python3)}
if [[ ! -x $venv/bin/python ]]; then
  say "creating $venv with $python_bin"
  "$python_bin" -m venv "$venv"
fi
py=$venv/bin/python
export PATH="$venv/bin:$PATH"  # `python` in the build scripts is this venv's
# pip prefers a `torch==X+cpu` from find-links (this machine's /opt/wheels, anyone's pip.conf) to PyPI's CUDA
# build of X (a local version label sorts higher): in this venv, find-links is an empty folder.
no_links=$(mktemp -d)
trap 'rmdir "$no_links"' EXIT
pip_install() {
  PIP_FIND_LINKS=$no_links "$py" -m pip install --quiet "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}
torch_cuda() {  # torch.version.cuda of the venv's torch, from torch/version.py (no CUDA libraries loaded)
  "$py" -c "import importlib.util as u, runpy; print(runpy.run_path(u.find_spec('torch').submodule_search_locations[0]
    + '/version.py').get('cuda') or '')" 2>/dev/null || true
}

# --- 1. torch's CUDA build, its CUDA and NCCL wheels, the project's requirements and hvdazure ---------------
cuda_major=${TORCH_CUDA_VERSION%%.*}
torch_pins=("torch==$TORCH_VERSION" "cuda-toolkit==$TORCH_CUDA_VERSION.*"
  "nvidia-nccl-cu$cuda_major==$TORCH_NCCL_VERSION.*")
if [[ $(torch_cuda) != "$TORCH_CUDA_VERSION"* ]]; then
  # A CPU torch of the same version would count as installed: it goes first.
  "$py" -m pip uninstall --quiet --yes torch 2>/dev/null || true
  say "installing ${torch_pins[*]} from PyPI (the CUDA build: about 3 GB, once)"
  pip_install --upgrade pip
  pip_install "${torch_pins[@]}"
fi
cuda=$(torch_cuda)
[[ $cuda == "$TORCH_CUDA_VERSION"* ]] || die "torch in $venv is built with CUDA '${cuda:-none}', not" \
  "$TORCH_CUDA_VERSION (versions.env TORCH_CUDA_VERSION): a CPU wheel from find-links or another index?"

# mpi4py from source against the Open MPI Horovod is built against, with setup_env.sh's flags; --no-cache-dir:
# pip's wheel cache may hold one built against another MPI.
mpi4py_version=$(sed -n 's/^mpi4py==\([^ #]*\).*/\1/p' requirements/base.txt)
if ! "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('mpi4py') != '$mpi4py_version')" 2>/dev/null
then
  say "building mpi4py $mpi4py_version against $(command -v mpicc) (about 2 minutes on 2 cores)"
  CFLAGS=-O1 MPICC=$(command -v mpicc) pip_install --no-cache-dir --no-binary mpi4py --no-deps \
    "mpi4py==$mpi4py_version"
fi
pip_install --no-binary mpi4py "${torch_pins[@]}" -r requirements/base.txt
pip_install --no-deps --no-build-isolation -e .

# --- 2. the CUDA toolkit from PyPI, and Horovod built with it (cached) ------------------------------------------
eval "$(PYTHON=$py bash scripts/pypi_cuda_toolkit.sh)"
hvd_env=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
  HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1)
wheel_dir=$cache/wheels/$(env "${hvd_env[@]}" bash scripts/build_horovod.sh --cache-key)
env "${hvd_env[@]}" bash scripts/build_horovod.sh --cached "$cache/wheels"
wheel=$(ls "$wheel_dir"/horovod-*.whl)
pip_install --no-deps --force-reinstall "$wheel"
say "horovod wheel: $wheel ($(du -h "$wheel" | cut -f1))"

# --- 3. checks: the extension loads with torch's CUDA libraries and has NCCL; the doctor's report -------------
"$py" - <<'PY' || die "horovod.torch does not load or lacks NCCL (above)"
import sys

import horovod.torch as hvd
import torch

hvd.init()
nccl = hvd.nccl_built()  # NCCL's version code (22907: 2.29.7), 0 without NCCL
print(f"[horovod-gpu] horovod.torch loads: torch {torch.__version__} (CUDA {torch.version.cuda}), NCCL: "
      f"{f'{nccl // 10000}.{nccl // 100 % 100}.{nccl % 100}' if nccl else 'not built'}, MPI: {hvd.mpi_built()}, "
      f"Gloo: {hvd.gloo_built()}, GPU visible: {torch.cuda.is_available()}")
sys.exit(0 if hvd.nccl_built() and hvd.mpi_built() and hvd.gloo_built() else 1)
PY
"$venv/bin/hvdazure" doctor || die "hvdazure doctor reports a problem (above)"
say "ready in $(( $(date +%s) - started ))s: $venv (activate it, or run $venv/bin/hvdazure)"
