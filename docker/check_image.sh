#!/usr/bin/env bash
# The last build step of both images: fail the build unless the stack inside is the one versions.env pins and
# Horovod can run it. Needs no GPU (the GPU image runs it against the CUDA driver stub).
#
#   check_image.sh cpu|gpu
#   HVDAZURE_VERSIONS_ENV   the pins to check against (default: /opt/hvdazure/versions.env, copied in by the build)
set -euo pipefail

variant=${1:?usage: check_image.sh cpu|gpu}
[[ $variant == cpu || $variant == gpu ]] || { echo "usage: check_image.sh cpu|gpu" >&2; exit 2; }
set -a  # the pins become environment variables, for the Python check below too
# shellcheck source=/dev/null
. "${HVDAZURE_VERSIONS_ENV:-/opt/hvdazure/versions.env}"
set +a
fail() { echo "check_image.sh: $*" >&2; exit 1; }

# 1. Horovod's own report: both frameworks, both controllers, and NCCL for the GPU tensors.
report=$(TF_CPP_MIN_LOG_LEVEL=3 horovodrun --check-build 2>&1) || fail "horovodrun --check-build failed:
$report"
echo "$report"
features=(PyTorch TensorFlow MPI Gloo)
[[ $variant == gpu ]] && features+=(NCCL)
for feature in "${features[@]}"; do
  [[ $report == *"[X] $feature"* ]] || fail "Horovod was built without $feature (see the report above)"
done

# 2. Open MPI's version is versions.env's.
mpi=$(mpirun --version 2>&1 | head -n 1)
[[ $mpi == *"Open MPI) ${OPENMPI_VERSION}."* ]] || fail "expected Open MPI ${OPENMPI_VERSION}.x, found: $mpi"

# 3. Python, the frameworks and Horovod are versions.env's; both Horovod bindings and hvdazure import.
VARIANT=$variant TF_CPP_MIN_LOG_LEVEL=3 python - <<'PY'
import os
import sys

import horovod
import horovod.tensorflow as hvd_tf
import horovod.torch as hvd_torch
import tensorflow as tf
import torch

import hvdazure

pins = os.environ
found = {
    "PYTHON_VERSION": f"{sys.version_info.major}.{sys.version_info.minor}",
    "TORCH_VERSION": torch.__version__.split("+")[0],
    "TENSORFLOW_VERSION": tf.__version__,
    "HOROVOD_VERSION": horovod.__version__,
}
if pins["VARIANT"] == "gpu":
    found["CUDA_VERSION"] = torch.version.cuda or "none (a CPU build of torch)"
    # Horovod reports the NCCL it was compiled against as NCCL_VERSION_CODE: 22304 is 2.23.4.
    code = hvd_torch.nccl_built()
    found["NCCL_VERSION"] = f"{code // 10000}.{code % 10000 // 100}"
    if hvd_tf.nccl_built() != code:
        sys.exit("check_image.sh: Horovod's TensorFlow binding was built without the same NCCL as PyTorch's")
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
echo "check_image.sh: $variant image OK"
