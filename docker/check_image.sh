#!/usr/bin/env bash
# The last build step of every image: fail the build unless the stack inside is the one versions.env pins and
# Horovod can run it. Needs no GPU: the GPU images' CUDA libraries load without a driver, and Horovod's NCCL is
# checked by what it was compiled against.
#
#   check_image.sh cpu|torch-gpu|tf-gpu
#   HVDAZURE_VERSIONS_ENV   the pins to check against (default: /opt/hvdazure/versions.env, copied in by the build)
set -euo pipefail

usage="usage: check_image.sh cpu|torch-gpu|tf-gpu"
kind=${1:?$usage}
[[ $kind =~ ^(cpu|torch-gpu|tf-gpu)$ ]] || { echo "$usage" >&2; exit 2; }
set -a  # the pins become environment variables, for the Python check below too
# shellcheck source=/dev/null
. "${HVDAZURE_VERSIONS_ENV:-/opt/hvdazure/versions.env}"
set +a
fail() { echo "check_image.sh: $*" >&2; exit 1; }

# 1. Horovod's own report: the image's frameworks, both controllers, and NCCL for the GPU tensors.
report=$(TF_CPP_MIN_LOG_LEVEL=3 horovodrun --check-build 2>&1) || fail "horovodrun --check-build failed:
$report"
echo "$report"
case $kind in
  cpu) features=(PyTorch TensorFlow MPI Gloo) ;;
  torch-gpu) features=(PyTorch MPI Gloo NCCL) ;;
  tf-gpu) features=(TensorFlow MPI Gloo NCCL) ;;
esac
for feature in "${features[@]}"; do
  [[ $report == *"[X] $feature"* ]] || fail "Horovod was built without $feature (see the report above)"
done

# 2. Open MPI's version is versions.env's.
mpi=$(mpirun --version 2>&1 | head -n 1)
[[ $mpi == *"Open MPI) ${OPENMPI_VERSION}."* ]] || fail "expected Open MPI ${OPENMPI_VERSION}.x, found: $mpi"

# 3. Python, the frameworks, Horovod and (GPU images) CUDA and NCCL are versions.env's; hvdazure imports.
KIND=$kind TF_CPP_MIN_LOG_LEVEL=3 python - <<'PY'
import importlib.metadata
import os
import sys

import horovod

import hvdazure

pins = os.environ
kind = pins["KIND"]
found = {"PYTHON_VERSION": f"{sys.version_info.major}.{sys.version_info.minor}",
         "HOROVOD_VERSION": horovod.__version__}


def major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def nccl_code_version(code: int) -> str:
    """Horovod reports the NCCL it was compiled against as NCCL_VERSION_CODE: 22907 is 2.29.7."""
    return f"{code // 10000}.{code % 10000 // 100}"


if kind in ("cpu", "torch-gpu"):
    import horovod.torch as hvd_torch
    import torch

    found["TORCH_VERSION"] = torch.__version__.split("+")[0]
if kind in ("cpu", "tf-gpu"):
    import horovod.tensorflow as hvd_tf
    import tensorflow as tf

    found["TENSORFLOW_VERSION"] = tf.__version__
if kind == "torch-gpu":
    # torch.version.cuda is what torch was compiled with; the NCCL wheel is the library every rank loads.
    found["TORCH_CUDA_VERSION"] = torch.version.cuda or "none (a CPU build of torch)"
    found["TORCH_NCCL_VERSION"] = nccl_code_version(hvd_torch.nccl_built())
    wheel = major_minor(importlib.metadata.version("nvidia-nccl-cu13"))
    if wheel != pins["TORCH_NCCL_VERSION"]:
        sys.exit(f"check_image.sh: the nvidia-nccl-cu13 wheel is {wheel}, not {pins['TORCH_NCCL_VERSION']}")
if kind == "tf-gpu":
    # TensorFlow loads the CUDA 12 runtime and NCCL from its [and-cuda] wheels.
    if not tf.test.is_built_with_cuda():
        sys.exit("check_image.sh: this TensorFlow is not a CUDA build")
    found["TF_CUDA_VERSION"] = major_minor(importlib.metadata.version("nvidia-cuda-runtime-cu12"))
    found["TF_NCCL_VERSION"] = nccl_code_version(hvd_tf.nccl_built())
    wheel = major_minor(importlib.metadata.version("nvidia-nccl-cu12"))
    if wheel != pins["TF_NCCL_VERSION"]:
        sys.exit(f"check_image.sh: the nvidia-nccl-cu12 wheel is {wheel}, not {pins['TF_NCCL_VERSION']}")
wrong = [f"{key}: expected {pins[key]}, found {value}" for key, value in found.items() if value != pins[key]]
if wrong:
    sys.exit("check_image.sh: versions differ from versions.env:\n  " + "\n  ".join(wrong))
print(f"versions match versions.env: {found}; hvdazure {hvdazure.__version__}")
PY

# 4. mpi4py is linked to the libmpi Horovod is linked to (hvdazure sweep hands mpi4py communicators to Horovod).
python -c "import sys; from hvdazure.launch.mpi_libraries import mpi4py_problem; sys.exit(mpi4py_problem())" \
  || fail "mpi4py and Horovod do not share one MPI library (above)"

# 5. The CLI starts (it is what Azure ML jobs and `docker run` call).
hvdazure --help >/dev/null || fail "hvdazure --help failed"
echo "check_image.sh: $kind image OK"
