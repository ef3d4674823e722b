#!/usr/bin/env bash
# Create or update the project environment (.venv) with the pinned PyTorch, TensorFlow, a patched Horovod
# build with PyTorch + TensorFlow + MPI + Gloo, the dev tools, and hvdazure itself (editable).
#
# Idempotent and cheap when nothing changed: a stamp of the pins is kept in the venv, and the Horovod wheel
# is cached outside the repo ($HVDAZURE_CACHE, default ~/.cache/hvdazure), keyed by everything the build
# depends on, so a fresh clone on the same machine reuses it instead of compiling again (10-20 minutes).
#
#   HVDAZURE_VENV   where the venv goes (default: <repo>/.venv)
#   HVDAZURE_CACHE  where built Horovod wheels are kept (default: ~/.cache/hvdazure)
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
pip_install() {  # quiet pip, minus the warnings some machines' pip.conf produces for every package
  "$py" -m pip install --quiet "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
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
# and Horovod version is enough (the full `--check-build` imports both frameworks: ~15 s).
installed_hvd=$("$py" -c "from importlib.metadata import version; print(version('horovod'))" 2>/dev/null || true)
if [[ -f $stamp && $(cat "$stamp") == "$pins_hash" && $installed_hvd == "$HOROVOD_VERSION" ]]; then
  say "environment up to date ($venv); nothing to do"
  exit 0
fi

say "installing pinned packages into $venv"
pip_install --upgrade pip
# PyPI's torch for Linux is the CUDA build (several GB). Without an NVIDIA GPU, the CPU build comes from
# PyTorch's index, unless a wheel satisfying the pin is already at hand (machines that cannot reach that
# index: asking it anyway costs retries on every package). torch_index.py prints the choice and why.
torch_index=$("$py" scripts/torch_index.py "torch==${TORCH_VERSION}")
read -ra torch_index_args <<<"$torch_index"
# requirements/azure.txt (Azure ML submission, SDK v2 and v1) resolves only with pip 26 or newer: the
# upgrade above brings it.
pip_install ${torch_index_args[@]+"${torch_index_args[@]}"} \
  "torch==${TORCH_VERSION}" "tensorflow-cpu==${TENSORFLOW_VERSION}" -r requirements/dev.txt \
  -r requirements/azure.txt

# --- 3. Horovod, built once per (versions, python, MPI, build recipe) and cached as a wheel --------------
if hvd_ok && "$py" -c "import horovod, sys; sys.exit(horovod.__version__ != '${HOROVOD_VERSION}')"; then
  say "horovod ${HOROVOD_VERSION} already built with PyTorch, TensorFlow, MPI and Gloo; reusing it"
else
  mpi_id=$(mpirun --version 2>/dev/null | head -n1)
  key=$(printf '%s\n' "$HOROVOD_VERSION" "$TORCH_VERSION" "$TENSORFLOW_VERSION" "$($py -V)" "$mpi_id" \
    "$(uname -m)" "$(sha256sum scripts/build_horovod.sh)" | sha256sum | cut -c1-16)
  wheel_dir=$cache/wheels/horovod-$HOROVOD_VERSION-$key
  if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
      HOROVOD_WITHOUT_MXNET=1 PATH="$venv/bin:$PATH" \
      bash scripts/build_horovod.sh "$wheel_dir.partial"
    rm -rf "$wheel_dir"; mv "$wheel_dir.partial" "$wheel_dir"  # only a finished build is ever reused
  else
    say "reusing cached horovod wheel from $wheel_dir"
  fi
  pip_install --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
  hvd_ok || die "horovod installed but 'horovodrun --check-build' lacks PyTorch, TensorFlow, MPI or Gloo:
$("$venv/bin/horovodrun" --check-build 2>&1 | tail -n 20)"
fi

# --- 4. hvdazure itself --------------------------------------------------------------------------------
pip_install --no-deps --no-build-isolation -e .
echo "$pins_hash" >"$stamp"
say "environment ready: $("$py" -c 'import torch, tensorflow as tf, horovod; print(f"torch {torch.__version__}, tensorflow {tf.__version__}, horovod {horovod.__version__}")' 2>/dev/null)"
