#!/usr/bin/env bash
# Build a Horovod wheel from the PyPI sdist, patched for current PyTorch/TensorFlow, into $1 (a folder).
# Used by scripts/setup_env.sh and by docker/*/Dockerfile, so every environment runs the same recipe.
# The active `python` must already have torch and/or tensorflow installed (no build isolation).
#
#   HOROVOD_VERSION       from versions.env (required)
#   HOROVOD_BUILD_LOG     where the compiler output goes (default: <out>/horovod-build.log)
#   HOROVOD_SDIST         horovod-<version>.tar.gz to build instead of downloading it from PyPI
#   HOROVOD_WITH_*/WITHOUT_*, HOROVOD_GPU_OPERATIONS   passed through to Horovod's own build
set -euo pipefail

out_dir=${1:?usage: build_horovod.sh OUT_DIR}
: "${HOROVOD_VERSION:?HOROVOD_VERSION must be set (source versions.env)}"
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
echo "horovod ${HOROVOD_VERSION} wheel built in $(( $(date +%s) - start ))s: $(ls "$out_dir"/horovod-*.whl)"
