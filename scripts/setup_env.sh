#!/usr/bin/env bash
# Create or update the project environment (.venv) with the pinned PyTorch, TensorFlow, a patched Horovod
# build with PyTorch + TensorFlow + MPI + Gloo, mpi4py built against the same MPI, the dev tools, and
# hvdazure itself (editable).
#
# Idempotent and cheap when nothing changed: a stamp of the pins is kept in the venv, and the Horovod and
# mpi4py wheels are cached outside the repo ($HVDAZURE_CACHE, default ~/.cache/hvdazure), keyed by
# everything their builds depend on, so a fresh clone on the same machine reuses them instead of compiling
# again (Horovod: 10-20 minutes, mpi4py: about 2 on 2 cores). Azurite (the Blob emulator the abfs://
# checkpoint tests use, from npm) is kept there too, by version.
#
#   HVDAZURE_VENV   where the venv goes (default: <repo>/.venv)
#   HVDAZURE_CACHE  where built Horovod and mpi4py wheels and Azurite are kept (default: ~/.cache/hvdazure)
#   PYTHON          the interpreter to create the venv with (default: python$PYTHON_VERSION, else python3)
#   HVDAZURE_TORCH_INDEX  the index to install PyTorch from: a URL, or "pypi" (or empty) for pip's default.
#                   Unset: PyTorch's CPU index where there is no NVIDIA GPU (see scripts/torch_index.py)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
set -a; . ./versions.env; set +a
venv=${HVDAZURE_VENV:-$root/.venv}
cache=${HVDAZURE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdazure}
say() { echo "[setup] $*"; }
pip_quiet() {  # quiet pip, minus the warnings some machines' pip.conf produces for every package
  "$py" -m pip "$@" --quiet 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}
pip_install() { pip_quiet install "$@"; }
# cached_wheel DIR COMMAND...: unless DIR holds a wheel, run COMMAND with DIR.partial appended (it writes the
# wheel there), then rename it to DIR, so that only a finished build is ever reused.
cached_wheel() {
  local dir=$1; shift
  if ls "$dir"/*.whl >/dev/null 2>&1; then
    say "reusing cached wheel from $dir"
    return
  fi
  rm -rf "$dir.partial"
  "$@" "$dir.partial"
  rm -rf "$dir"; mv "$dir.partial" "$dir"
}
die() { echo "[setup] ERROR: $*" >&2; exit 1; }

# --- 1. system packages: MPI for Horovod's MPI controller; highwayhash/farmhash for TF's headers -------
apt_packages=(openmpi-bin libopenmpi-dev libhighwayhash-dev libfarmhash-dev cmake g++ make)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]] && ! command -v sudo >/dev/null; then
    die "missing system packages: ${missing[*]}; install them with: apt-get install ${missing[*]}"
  fi
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo=sudo
  say "installing system packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mpi_id=$(mpirun --version 2>/dev/null | head -n1)  # part of the cache keys of the wheels built against MPI

# --- 1b. Azurite, the Blob emulator the abfs:// checkpoint tests run against (tests/storage/), cached outside
# the repo next to the wheels, keyed by AZURITE_VERSION. Checked on every run, before the stamp: a second
# is all it costs once cached. Without Node.js it is skipped with a message, and so are those tests.
azurite_status=0
azurite_bin=$(bash scripts/install_azurite.sh) || azurite_status=$?
if ((azurite_status == 0)); then
  say "Azurite $AZURITE_VERSION: $azurite_bin"
elif ((azurite_status != 3)); then
  die "installing Azurite $AZURITE_VERSION failed (above)"
fi

# --- 2. the venv and pinned Python packages --------------------------------------------------------------
python_bin=${PYTHON:-$(command -v "python${PYTHON_VERSION}" || command -v python3)}
if [[ ! -x $venv/bin/python ]]; then
  say "creating $venv with $python_bin"
  "$python_bin" -m venv "$venv"
fi
py=$venv/bin/python
pins_hash=$(cat versions.env requirements/*.txt setup.py scripts/setup_env.sh scripts/build_horovod.sh \
  scripts/torch_index.py | sha256sum | cut -c1-16)
stamp=$venv/.hvdazure-setup-stamp

hvd_ok() {  # Horovod is usable only with both frameworks and both controllers compiled in
  local report
  report=$(TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/horovodrun" --check-build 2>/dev/null) || return 1
  for feature in PyTorch TensorFlow MPI Gloo; do
    grep -q "\[X\] $feature" <<<"$report" || return 1
  done
}

# The stamp is written only after the full check below passed with exactly these pins, so a matching stamp
# and Horovod version is enough (the full `--check-build` imports both frameworks: ~15 s). mpi4py's libmpi is
# checked too (ldd, no MPI started): a later `pip install` may have put PyPI's wheel in its place.
installed=$("$py" - 2>/dev/null <<'PY' || true
from importlib.metadata import version
from hvdazure.launch.mpi_libraries import mpi4py_problem
print(version("horovod"), "mpi4py-ok" if mpi4py_problem() is None else "mpi4py-wrong")
PY
)
if [[ -f $stamp && $(cat "$stamp") == "$pins_hash" && $installed == "$HOROVOD_VERSION mpi4py-ok" ]]; then
  say "environment up to date ($venv); nothing to do"
  exit 0
fi

say "installing pinned packages into $venv"
pip_install --upgrade pip

# mpi4py, built from source against the MPI whose mpicc is on PATH, the one Horovod is built against below:
# hvdazure sweep hands mpi4py's communicators to Horovod, so both must load one libmpi (PyPI's mpi4py wheels
# choose theirs at run time). Installed before the bulk install, which then finds the pin in base.txt
# satisfied; that install has --no-binary mpi4py as well, so it can never take PyPI's wheel instead.
mpi4py_version=$(sed -n 's/^mpi4py==\([^ #]*\).*/\1/p' requirements/base.txt)
[[ -n $mpi4py_version ]] || die "requirements/base.txt has no mpi4py==VERSION pin"
mpicc=$(command -v mpicc) || die "mpicc not found: install libopenmpi-dev"
# -O1: mpi4py is one large generated C file whose functions only forward to MPI; -O1 compiles it in about 2
# minutes on 2 cores against 3.5 with the default -O2 (measured here; -O0 takes 30 s but leaves every
# wrapper unoptimised, which would show in small-message latencies: hvdazure bench allreduce compares them).
mpi4py_cflags="-O1"
build_mpi4py() {  # build_mpi4py OUT_DIR; --no-cache-dir: pip's wheel cache may hold one built for another MPI
  say "building mpi4py $mpi4py_version against $mpi_id ($mpicc, CFLAGS=$mpi4py_cflags; about 2 minutes on 2 cores)"
  CFLAGS=$mpi4py_cflags MPICC=$mpicc pip_quiet wheel --no-cache-dir --no-binary mpi4py --no-deps "mpi4py==$mpi4py_version" -w "$1"
}
key=$(printf '%s\n' "$mpi4py_version" "$($py -V)" "$mpi_id" "$mpicc" "$(uname -m)" "$mpi4py_cflags" | sha256sum \
  | cut -c1-16)
wheel_dir=$cache/wheels/mpi4py-$mpi4py_version-$key
cached_wheel "$wheel_dir" build_mpi4py
pip_install --no-deps --force-reinstall "$wheel_dir"/mpi4py-*.whl

# PyPI's torch for Linux is the CUDA build (several GB). Without an NVIDIA GPU, the CPU build comes from
# PyTorch's index, unless a wheel satisfying the pin is already at hand (machines that cannot reach that
# index: asking it anyway costs retries on every package). torch_index.py prints the choice and why.
torch_index=$("$py" scripts/torch_index.py "torch==${TORCH_VERSION}")
read -ra torch_index_args <<<"$torch_index"
# requirements/azure.txt (Azure ML submission, SDK v2 and v1) resolves only with pip 26 or newer: the
# upgrade above brings it. requirements/docs.txt: the documentation site and its tests (make docs).
pip_install ${torch_index_args[@]+"${torch_index_args[@]}"} --no-binary mpi4py \
  "torch==${TORCH_VERSION}" "tensorflow-cpu==${TENSORFLOW_VERSION}" -r requirements/dev.txt \
  -r requirements/azure.txt -r requirements/bench.txt -r requirements/docs.txt
# Keras 2 for `hvdazure bench peers`' MultiWorkerMirroredStrategy peer (requirements/bench.txt says why
# without its dependencies); its releases follow TensorFlow's.
pip_install --no-deps "tf-keras==${TENSORFLOW_VERSION}"

# --- 3. Horovod, built once per (versions, python, MPI, build recipe) and cached as a wheel --------------
if hvd_ok && "$py" -c "import horovod, sys; sys.exit(horovod.__version__ != '${HOROVOD_VERSION}')"; then
  say "horovod ${HOROVOD_VERSION} already built with PyTorch, TensorFlow, MPI and Gloo; reusing it"
else
  # build_horovod.sh keys and caches the wheel (--cache-key, --cached), for scripts/build_horovod_gpu.sh too.
  hvd_env=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
    HOROVOD_WITHOUT_MXNET=1 PATH="$venv/bin:$PATH")
  wheel_dir=$cache/wheels/$(env "${hvd_env[@]}" bash scripts/build_horovod.sh --cache-key)
  env "${hvd_env[@]}" bash scripts/build_horovod.sh --cached "$cache/wheels"
  pip_install --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
  hvd_ok || die "horovod installed but 'horovodrun --check-build' lacks PyTorch, TensorFlow, MPI or Gloo:
$("$venv/bin/horovodrun" --check-build 2>&1 | tail -n 20)"
fi

# --- 4. hvdazure itself --------------------------------------------------------------------------------
pip_install --no-deps --no-build-isolation -e .
# mpi4py and Horovod linked to one libmpi (hvdazure sweep's precondition); no MPI is started to check it
"$py" -c "import sys; from hvdazure.launch.mpi_libraries import mpi4py_problem; sys.exit(mpi4py_problem())" \
  || die "mpi4py and Horovod do not share one MPI library (above)"
echo "$pins_hash" >"$stamp"
say "environment ready: $("$py" -c 'import torch, tensorflow as tf, horovod; print(f"torch {torch.__version__}, tensorflow {tf.__version__}, horovod {horovod.__version__}")' 2>/dev/null)"
