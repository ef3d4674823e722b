#!/usr/bin/env bash
# The GPU check (docs/guides/gpus.md, "The GPU check"): on a machine with one NVIDIA GPU, PyTorch, nvcc and
# CMake but no Horovod and no internet, build Horovod for that torch with NCCL and Gloo from the sdist the
# bundle carried (scripts/gpu_check_bundle.sh), then run scripts/gpu_check.py's rows on cuda:0 and write one
# table. Without a GPU it runs the CPU fallbacks with the Horovod already importable (no build).
#
#   scripts/gpu_check.sh [OUT_DIR]     (default: $OUT where set, else ./gpu-check-out)
#
#   GPU_CHECK_PYTHON   the Python with torch (default: python3)
#   GPU_CHECK_BUILD    auto (build where a GPU is visible and Horovod has no NCCL), always, never
#   GPU_CHECK_BUDGET   seconds for everything, the build included (default 330: inside a 360 s `run`, which
#                      leaves a second start and run within a 15-minute device budget)
#   GPU_CHECK_PARALLEL the one-rank rows run at a time (default: 4 with a GPU, else 1)
#   GPU_CHECK_ROWS     the rows to run, comma-separated (default: all; scripts/gpu_check.py --help)
#   HOROVOD_SDIST      the sdist (default: .gpu-check/horovod-<HOROVOD_VERSION>.tar.gz)
#   HOROVOD_BUILD_CUDA_CC_LIST   the GPU architectures to compile for (default: the visible GPU's, else 90)
#   HVDAZURE_CUDA_TOOLKIT   scripts/pypi_cuda_toolkit.sh's mode (default: system where an nvcc is, else auto)
# The built wheel is kept in .gpu-check-cache/ (build_horovod.sh --cached; ignored, not carried): a rerun on
# the same machine skips the build. Exit status: gpu_check.py's (1 if a row failed), or 2 when it could not start.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
started=$(date +%s)
out=${1:-${OUT:-$repo/gpu-check-out}}
mkdir -p "$out" && out=$(cd "$out" && pwd)
python=${GPU_CHECK_PYTHON:-python3}
python=$(command -v "$python") || { echo "gpu_check.sh: no Python '${GPU_CHECK_PYTHON:-python3}'" >&2; exit 2; }
budget=${GPU_CHECK_BUDGET:-330}
mode=${GPU_CHECK_BUILD:-auto}
# shellcheck source=/dev/null
set -a && source "$repo/versions.env" && set +a  # HOROVOD_VERSION for build_horovod.sh too
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export MAKEFLAGS=${MAKEFLAGS:--j$(nproc)}
build_json=$out/build.json

build_result() {  # build_result STATUS SECONDS DETAIL
  "$python" - "$build_json" "$1" "$2" "$3" "$device" <<'PY'
import json, sys
path, status, seconds, detail, device = sys.argv[1:]
json.dump({"status": status, "seconds": float(seconds) if seconds else None, "detail": detail,
           "device": device}, open(path, "w"))
PY
}

# Wheels the bundle carried (GPU_CHECK_WHEELS in scripts/gpu_check_bundle.sh), ahead of the machine's own
if compgen -G "$repo/.gpu-check/wheels/*.whl" >/dev/null; then
  carried=$(mktemp -d)
  "$python" -m pip install --quiet --no-deps --no-index --no-compile --target "$carried" \
    "$repo"/.gpu-check/wheels/*.whl || { echo "gpu_check.sh: the carried wheels do not install" >&2; exit 2; }
  export PYTHONPATH="$carried:$PYTHONPATH"
fi

# What is here: a GPU (and its compute capability), and Horovod's GPU operations if it imports.
read -r has_gpu cc torch_version < <("$python" -c '
import torch
gpu = torch.cuda.is_available()
cc = "%d%d" % torch.cuda.get_device_capability(0) if gpu else "90"
print(int(gpu), cc, torch.__version__)') || { echo "gpu_check.sh: $python has no working torch" >&2; exit 2; }
device=$([[ $has_gpu == 1 ]] && echo cuda:0 || echo cpu)
horovod_ops() { "$python" -c 'import horovod.torch as h; print("nccl" if h.nccl_built() else "no-nccl")' \
  2>/dev/null || echo none; }
ops=$(horovod_ops)
echo "gpu_check.sh: torch $torch_version, GPU visible: $has_gpu (sm_$cc), Horovod: $ops, budget ${budget}s"

case $mode in
  always) build=1 ;;
  never) build=0 ;;
  auto) build=$([[ $has_gpu == 1 && $ops != nccl ]] && echo 1 || echo 0) ;;
  *) echo "gpu_check.sh: GPU_CHECK_BUILD=$mode: one of auto, always, never" >&2; exit 2 ;;
esac

# CUDA and NCCL for the build: scripts/pypi_cuda_toolkit.sh's exports (NCCL from torch's own nvidia-nccl
# wheel; the toolkit from the machine's nvcc where it has one: it has no network for PyPI's wheels).
toolkit_exports() {  # toolkit_exports LOG: eval's the exports; the last line of LOG says why not
  local mode=${HVDAZURE_CUDA_TOOLKIT:-} exports
  if [[ -z $mode ]]; then
    mode=auto
    if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then mode=system; fi
  fi
  exports=$(HVDAZURE_CUDA_TOOLKIT=$mode PYTHON=$python bash "$repo/scripts/pypi_cuda_toolkit.sh" 2>"$1") || return 1
  eval "$exports"
  export LD_LIBRARY_PATH="$HOROVOD_NCCL_HOME/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

if [[ $build == 0 ]]; then
  why=$([[ $has_gpu == 0 ]] && echo "no GPU: the CPU fallbacks use the Horovod here ($ops)" \
        || echo "Horovod with NCCL already importable")
  [[ $mode == never ]] && why="GPU_CHECK_BUILD=never; Horovod here: $ops"
  build_result "not run: $why" "" ""
else
  sdist=${HOROVOD_SDIST:-$repo/.gpu-check/horovod-$HOROVOD_VERSION.tar.gz}
  export HOROVOD_BUILD_CUDA_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-$cc} HOROVOD_GPU_OPERATIONS=NCCL \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_SDIST=$sdist HOROVOD_BUILD_LOG=$out/horovod-build.log
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # build_horovod.sh runs `python`: a wrapper, not a link (a venv's python found through a link elsewhere
  # does not find its venv)
  mkdir -p "$work/bin" && printf '#!/bin/sh\nexec %q "$@"\n' "$python" >"$work/bin/python"
  chmod +x "$work/bin/python"
  export PATH="$work/bin:$PATH"
  cache=$repo/.gpu-check-cache  # ignored and not carried: a rerun on the same machine reuses the wheel
  begin=$(date +%s)
  problem="" wheel="" reused=""
  if [[ ! -f $sdist ]]; then
    problem="no sdist at $sdist (scripts/gpu_check_bundle.sh puts it there)"
  elif ! toolkit_exports "$work/toolkit.log"; then
    problem="CUDA/NCCL: $(tail -n1 "$work/toolkit.log")"
  else
    echo "gpu_check.sh: Horovod $HOROVOD_VERSION with NCCL + Gloo for sm_$HOROVOD_BUILD_CUDA_CC_LIST" \
      "($MAKEFLAGS; CUDA from $HVDAZURE_CUDA_TOOLKIT_SOURCE $HOROVOD_CUDA_HOME) from $sdist"
    key=$(bash "$repo/scripts/build_horovod.sh" --cache-key)
    if compgen -G "$cache/$key/horovod-*.whl" >/dev/null; then reused="; reused: built earlier here"; fi
    build_s=$((budget - 60 - ($(date +%s) - started)))  # a minute at least for the rows and the table
    if timeout "$build_s" bash "$repo/scripts/build_horovod.sh" --cached "$cache"; then
      wheel=$(ls "$cache/$key"/horovod-*.whl 2>/dev/null | head -n1)
      [[ -n $wheel ]] || problem="build_horovod.sh --cached left no wheel in $cache"
    elif (($? == 124)); then
      problem="the build was stopped after ${build_s}s, the budget's share (GPU_CHECK_BUDGET=$budget)"
    else
      problem="the build failed: see horovod-build.log"
    fi
  fi
  if [[ -z $problem ]] && ! "$python" -m pip install --quiet --no-deps --no-index --no-compile \
       --target "$work/site" "$wheel" >"$work/pip.log" 2>&1; then
    problem="pip could not install $wheel: $(tail -n1 "$work/pip.log")"
  fi
  seconds=$(( $(date +%s) - begin ))
  if [[ -n $problem ]]; then
    echo "gpu_check.sh: $problem" >&2
    build_result FAILED "$seconds" "$problem"
  else
    export PYTHONPATH="$work/site:$PYTHONPATH"
    size=$(du -k "$wheel" | cut -f1)
    detail="$(basename "$wheel") (${size} KiB, sm_$HOROVOD_BUILD_CUDA_CC_LIST"
    detail+=", CUDA from $HVDAZURE_CUDA_TOOLKIT_SOURCE$reused); Horovod now: $(horovod_ops)"
    build_result passed "$seconds" "$detail"
  fi
fi

left=$(( budget - ($(date +%s) - started) ))
# a GPU has room for several of the one-rank rows' small jobs at once; 2 cores without one do not
parallel=${GPU_CHECK_PARALLEL:-$([[ $has_gpu == 1 ]] && echo 4 || echo 1)}
"$python" "$repo/scripts/gpu_check.py" --out "$out" --build-json "$build_json" --budget "$left" \
  --parallel "$parallel" \
  ${GPU_CHECK_ROWS:+--rows "$GPU_CHECK_ROWS"}
status=$?
echo "gpu_check.sh: table in $out/gpu_check.md and $out/gpu_check.json, the jobs' output in $out/gpu_check.log"
exit $status
