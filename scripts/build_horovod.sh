#!/usr/bin/env bash
# Build a Horovod wheel from the PyPI sdist, patched for current PyTorch/TensorFlow, into $1 (a folder).
# Used by scripts/setup_env.sh, scripts/build_horovod_gpu.sh and docker/*/Dockerfile, so every environment runs
# the same recipe. The active `python` must already have torch and/or tensorflow installed (no build isolation).
#
#   build_horovod.sh OUT_DIR             build the wheel into OUT_DIR
#   build_horovod.sh --cached CACHE_DIR  build it into CACHE_DIR/<cache key>/, unless a wheel is there already
#                                        (built into <cache key>.partial and renamed: only a finished build counts)
#   build_horovod.sh --cache-key         print that folder's name, horovod-<version>[-cuda<X.Y>]-<hash>: the hash
#                                        of everything the build depends on (this script, the frameworks installed
#                                        in the active python, the python, MPI, the machine, the HOROVOD_WITH*/
#                                        GPU settings, nvcc's and NCCL's versions)
#
#   HOROVOD_VERSION       from versions.env (required)
#   HOROVOD_BUILD_LOG     where the compiler output goes (default: <out>/horovod-build.log)
#   HOROVOD_SDIST         horovod-<version>.tar.gz to build instead of downloading it from PyPI
#   HOROVOD_WITH_*/WITHOUT_*, HOROVOD_GPU_OPERATIONS   passed through to Horovod's own build
#   HOROVOD_GPU_OPERATIONS=NCCL   a CUDA build: nvcc from HOROVOD_CUDA_HOME/bin or PATH, NCCL from HOROVOD_NCCL_HOME;
#                         `eval "$(bash scripts/pypi_cuda_toolkit.sh)"` sets up both from PyPI's wheels
#   HOROVOD_BUILD_CUDA_CC_LIST    the GPU architectures of Horovod's CUDA kernels (default: see cuda_archs below)
set -euo pipefail

: "${HOROVOD_VERSION:?HOROVOD_VERSION must be set (source versions.env)}"
self=${BASH_SOURCE[0]}
die() { echo "build_horovod.sh: $*" >&2; exit 1; }

# --- a CUDA build: nvcc's release and the GPU architectures to compile for ------------------------------------
cuda_release=""
if [[ -n ${HOROVOD_GPU_OPERATIONS:-} ]]; then
  nvcc=${HOROVOD_CUDA_HOME:+$HOROVOD_CUDA_HOME/bin/}nvcc
  command -v "$nvcc" >/dev/null || die "HOROVOD_GPU_OPERATIONS=$HOROVOD_GPU_OPERATIONS needs nvcc, and $nvcc" \
    "is not there: run eval \"\$(bash scripts/pypi_cuda_toolkit.sh)\" first"
  cuda_release=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\),.*/\1/p')
  if [[ -z ${HOROVOD_BUILD_CUDA_CC_LIST:-} ]]; then
    # Horovod compiles for every architecture nvcc knows unless told (CUDA 13: 12, each twice, for two C++
    # ABIs). These are the data-centre ones: V100 7.0 (where nvcc still has it: CUDA 13 dropped Volta), T4 7.5,
    # A100 8.0, A10 8.6, L4/L40S 8.9, H100/H200 9.0, B200/GB200 10.0 (GB300's 10.3 runs 10.0's code), RTX PRO
    # 6000 Blackwell 12.0. The newest is compiled to PTX as well (Horovod's rule), for later GPUs to JIT.
    supported=" $("$nvcc" --list-gpu-arch | sed -n 's/^compute_\([0-9]*\)$/\1/p' | tr '\n' ' ') "
    cuda_archs=""
    for cc in 70 75 80 86 89 90 100 120; do
      if [[ $supported == *" $cc "* ]]; then cuda_archs+=${cuda_archs:+,}$cc; fi
    done
    export HOROVOD_BUILD_CUDA_CC_LIST=$cuda_archs
  fi
fi

cache_key() {  # the --cache-key folder name (see above)
  local frameworks nccl_version=""
  frameworks=$(python - <<'PY'
from importlib import metadata
for name in ("torch", "tensorflow", "tensorflow-cpu", "mxnet"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        pass
PY
)
  if [[ -n $cuda_release && -f ${HOROVOD_NCCL_HOME:-}/include/nccl.h ]]; then
    nccl_version=$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' \
      "$HOROVOD_NCCL_HOME/include/nccl.h" | paste -sd.)
  fi
  local hash
  hash=$(printf '%s\n' "$HOROVOD_VERSION" "$frameworks" "$(python -V)" "$(mpirun --version 2>/dev/null | head -n1)" \
    "$(uname -m)" "$(sha256sum <"$self")" \
    "$(env | grep -E '^HOROVOD_(WITH|WITHOUT|GPU|NCCL_LINK|CPU_OPERATIONS|BUILD_CUDA_CC_LIST)' | sort)" \
    "${nvcc:+$("$nvcc" --version | tail -n1)}" "$nccl_version" | sha256sum | cut -c1-16)
  echo "horovod-$HOROVOD_VERSION${cuda_release:+-cuda$cuda_release}-$hash"
}

case ${1:-} in
  --cache-key)
    cache_key
    exit 0 ;;
  --cached)
    cache_root=${2:?usage: build_horovod.sh --cached CACHE_DIR}
    dir=$cache_root/$(cache_key)
    if ls "$dir"/horovod-*.whl >/dev/null 2>&1; then
      echo "reusing the cached horovod wheel $(ls "$dir"/horovod-*.whl)"
      exit 0
    fi
    rm -rf "$dir.partial"
    bash "$self" "$dir.partial"
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
    echo "cached in $dir"
    exit 0 ;;
  ""|-*)
    die "usage: build_horovod.sh OUT_DIR | --cached CACHE_DIR | --cache-key" ;;
esac
out_dir=$1
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)
log=${HOROVOD_BUILD_LOG:-$out_dir/horovod-build.log}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [[ -n ${HOROVOD_SDIST:-} ]]; then  # a local sdist, for machines without internet (scripts/gpu_check.sh)
  cp "$HOROVOD_SDIST" "$work/horovod-${HOROVOD_VERSION}.tar.gz"
else
  python -m pip download --quiet --no-deps --no-binary :all: "horovod==${HOROVOD_VERSION}" -d "$work"
fi
tar -xzf "$work/horovod-${HOROVOD_VERSION}.tar.gz" -C "$work"
src="$work/horovod-${HOROVOD_VERSION}"

# Each patch fails loudly if its target text is gone, so a new Horovod release cannot be half-patched.
patch_text() {  # patch_text FILE OLD NEW WHY
  python - "$1" "$2" "$3" <<'PY'
import sys
path, old, new = sys.argv[1:4]
text = open(path).read()
if old not in text:
    sys.exit(f"build_horovod.sh: patch target not found in {path}: {old!r}")
open(path, "w").write(text.replace(old, new))
PY
  echo "patched $1: $4"
}

# PyTorch >= 2.1 and TensorFlow >= 2.16 headers use C++17 features (std::optional, if constexpr, ...).
patch_text "$src/CMakeLists.txt" "set(CMAKE_CXX_STANDARD 14)" "set(CMAKE_CXX_STANDARD 17)" \
  "C++17 for the core library"
patch_text "$src/horovod/torch/CMakeLists.txt" "set(CMAKE_CXX_STANDARD 14)" "set(CMAKE_CXX_STANDARD 17)" \
  "C++17 for the PyTorch extension"
# GCC 13's libstdc++ no longer includes <stdexcept> and <string> through <unordered_map>, <memory> and the like,
# which Horovod 0.28.1 relies on (GCC 13 is Ubuntu 24.04's: docker/tf-gpu's build stage; GCC 12 needs neither).
patch_text "$src/horovod/common/common.h" "#include <unordered_set>" "#include <stdexcept>
#include <unordered_set>" "<stdexcept> for std::logic_error (GCC 13)"
patch_text "$src/horovod/common/group_table.h" "#include <unordered_map>" "#include <string>
#include <unordered_map>" "<string> for std::string (GCC 13)"
# TensorFlow 2.21's absl::Status has message() (a string_view) instead of error_message().
patch_text "$src/horovod/tensorflow/mpi_ops.cc" "status.error_message()" "std::string(status.message())" \
  "TF 2.21 renamed Status::error_message() to message()"
# TensorFlow 2.21 renamed DeviceBase::tensorflow_gpu_device_info() to tensorflow_accelerator_device_info().
patch_text "$src/horovod/tensorflow/mpi_ops.cc" "tensorflow_gpu_device_info()" "tensorflow_accelerator_device_info()" \
  "TF 2.21 renamed tensorflow_gpu_device_info()"
# GPU builds only (both texts sit under #if HAVE_GPU): TF 2.21 no longer exports
# stream_executor::gpu::AsGpuStreamValue(), so define it from Stream::platform_specific_handle(). Compiled
# against TF 2.21's headers; not yet run on a GPU.
patch_text "$src/horovod/tensorflow/mpi_ops.cc" "GpuStreamHandle AsGpuStreamValue(Stream* stream);" "" \
  "TF 2.21 dropped AsGpuStreamValue() (GPU builds only)"
patch_text "$src/horovod/tensorflow/mpi_ops.cc" '#include "tensorflow/compiler/xla/stream_executor/stream.h"' \
'#include "tensorflow/compiler/xla/stream_executor/stream.h"
namespace stream_executor { namespace gpu {
inline GpuStreamHandle AsGpuStreamValue(Stream* stream) {
  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);
}
}}  // namespace stream_executor::gpu' "GPU stream from Stream::platform_specific_handle() (TF 2.21)"
# TF 2.21 moved the XLA headers these ops include; XLA ops are an optional GPU-only feature we don't use.
patch_text "$src/horovod/tensorflow/CMakeLists.txt" \
  'list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")' "" \
  "dropped xla_mpi_ops.cc (XLA headers moved in TF 2.21)"

if [[ -n $cuda_release ]]; then
  # Horovod compiles its CUDA kernels as C++11. CUDA 13's CCCL headers (cuda/std/...) refuse anything before
  # C++17 (checked with nvcc 13.0), and GCC 14's libstdc++ fails under nvcc -std=c++11; the rest of the
  # build is C++17 already (above).
  patch_text "$src/horovod/common/ops/cuda/CMakeLists.txt" "set(CMAKE_CUDA_STANDARD 11)" \
    "set(CMAKE_CUDA_STANDARD 17)" "C++17 for the CUDA kernels (CUDA 13, GCC 14)"
  echo "CUDA $cuda_release build: nvcc $(command -v "$nvcc"), NCCL ${HOROVOD_NCCL_HOME:-from the CUDA toolkit}," \
    "architectures $HOROVOD_BUILD_CUDA_CC_LIST (the last also as PTX)"
fi

# CMake 4 refuses Horovod's (and its third-party) cmake_minimum_required below 3.5.
export CMAKE_POLICY_VERSION_MINIMUM=3.5
export HOROVOD_WITHOUT_MXNET=${HOROVOD_WITHOUT_MXNET:-1}
export MAKEFLAGS=${MAKEFLAGS:--j$(nproc)}
export HOROVOD_BUILD_ARCH_FLAGS=${HOROVOD_BUILD_ARCH_FLAGS:-}

echo "building horovod ${HOROVOD_VERSION} (log: $log); 3 to 20 minutes, depending on the machine"
start=$(date +%s)
if ! python -m pip wheel --no-build-isolation --no-cache-dir --no-deps -v -w "$out_dir" "$src" >"$log" 2>&1; then
  echo "horovod build FAILED after $(( $(date +%s) - start ))s; last lines of $log:" >&2
  tail -n 40 "$log" >&2
  if grep -q "fatal error: .*highwayhash\|fatal error: .*farmhash" "$log"; then
    echo "likely cause: TensorFlow headers need Debian's libhighwayhash-dev and libfarmhash-dev" >&2
  elif grep -q "mpi.h: No such file" "$log"; then
    echo "likely cause: MPI headers missing; install openmpi-bin libopenmpi-dev" >&2
  elif grep -qi "Compatibility with CMake < 3.5" "$log"; then
    echo "likely cause: CMake 4 without CMAKE_POLICY_VERSION_MINIMUM=3.5" >&2
  elif grep -q "No module named 'torch'\|No module named 'tensorflow'" "$log"; then
    echo "likely cause: build the wheel with torch and tensorflow already installed in this python" >&2
  fi
  exit 1
fi
wheel=$(ls "$out_dir"/horovod-*.whl)
echo "horovod ${HOROVOD_VERSION} wheel built in $(( $(date +%s) - start ))s: $wheel ($(du -h "$wheel" | cut -f1))"
