#!/usr/bin/env bash
# Build an image where there is no Docker daemon and no Docker Hub, with buildah, and run hvdazure inside it.
# A benchmark-style experiment, not part of CI: it needs root, buildah and debootstrap (`apt-get install buildah
# debootstrap`), PyPI and a Debian mirror, and takes tens of minutes (the CPU image) to an hour (torch-gpu).
#
#   docker/build_local.sh cpu|torch-gpu [WORK_DIR]     (default: /tmp/hvdazure-local-build)
#
#   1. a stand-in for python:3.11-slim-bookworm, both images' base, made from Debian 12's own packages by
#      debootstrap (the same Debian release and Open MPI as the real base; Python is Debian's 3.11, with headers,
#      not python.org's)
#   2. cpu: PyTorch's CPU index served from the local wheels in $PIP_FIND_LINKS when download.pytorch.org is
#      unreachable (torch-gpu takes PyPI's torch, the CUDA 13 build, and needs no index)
#   3. docker/build.sh KIND --builder buildah, with chroot isolation (no daemon, no user namespaces needed)
#   4. inside the built image: `hvdazure doctor`, samples/collectives_check.py on 2 ranks (Gloo and MPI), and for
#      torch-gpu samples/torch_digits.py on 2 ranks, all on the CPU
#
# tf-gpu is not built this way: its build stage needs NVIDIA's CUDA 12 devel image for nvcc (PyPI has no CUDA 12
# nvcc), which this script cannot stand in for; docs/guides/docker.md says what was tried.
#
#   STORAGE_DRIVER   buildah storage driver (default: overlay; vfs needs no kernel overlayfs but copies every
#                    layer in full: here it filled over 30 GB and then failed to commit the layer holding the venv)
#   EXTRA_CA_DIR     *.crt files the stand-in base trusts besides Debian's CAs, for machines behind a proxy that
#                    re-signs TLS (default: /usr/local/share/ca-certificates, this machine's local CAs)
#   BUILD_ARGS       more arguments for `buildah build` (e.g. "--target deps" to build the dependency layers only)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kind=${1:-}
case $kind in
  cpu | torch-gpu) ;;
  tf-gpu) echo "build_local.sh: tf-gpu needs nvidia/cuda's CUDA 12 devel image, which has no local stand-in;" \
    "build it with docker/build.sh tf-gpu (docs/guides/docker.md)" >&2; exit 2 ;;
  *) echo "usage: build_local.sh cpu|torch-gpu [WORK_DIR]" >&2; exit 2 ;;
esac
work=${2:-/tmp/hvdazure-local-build}
# shellcheck source=../versions.env
set -a; . "$root/versions.env"; set +a
storage=(--storage-driver "${STORAGE_DRIVER:-overlay}")
base=localhost/python:${PYTHON_VERSION}-slim-bookworm-standin
image=localhost/hvdazure-$kind:local
mkdir -p "$work"
log() { echo "[local-build $(date +%H:%M:%S)] $*"; }
for tool in buildah debootstrap; do
  command -v "$tool" >/dev/null || { echo "build_local.sh: needs $tool (apt-get install $tool)" >&2; exit 1; }
done

# --- 1. base image ----------------------------------------------------------------------------------------------
start=$(date +%s)
if ! buildah "${storage[@]}" inspect --type image "$base" >/dev/null 2>&1; then
  log "making $base with debootstrap"
  rm -rf "$work/rootfs"
  debootstrap --variant=minbase --include=ca-certificates bookworm "$work/rootfs" http://deb.debian.org/debian \
    >"$work/debootstrap.log" 2>&1
  cp "${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}"/*.crt "$work/rootfs/usr/local/share/ca-certificates/" \
    2>/dev/null && chroot "$work/rootfs" update-ca-certificates >/dev/null 2>&1
  ctr=$(buildah "${storage[@]}" from scratch)
  buildah "${storage[@]}" copy "$ctr" "$work/rootfs" / >/dev/null
  # What python:3.11-slim has: the interpreter, venv, and the headers that compiling Horovod needs.
  buildah "${storage[@]}" run --isolation chroot "$ctr" -- sh -c "apt-get update -qq && apt-get install -y -qq \
    --no-install-recommends python${PYTHON_VERSION} python${PYTHON_VERSION}-venv python${PYTHON_VERSION}-dev \
    && rm -rf /var/lib/apt/lists/*" >>"$work/debootstrap.log" 2>&1
  # pip's own CA bundle would not include those local CAs; point it at the system store.
  buildah "${storage[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env PIP_CERT=/etc/ssl/certs/ca-certificates.crt --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    --cmd bash "$ctr"
  buildah "${storage[@]}" commit --quiet --rm "$ctr" "$base" >/dev/null
  rm -rf "$work/rootfs"
fi
base_s=$(($(date +%s) - start))

# --- 2. PyTorch's CPU wheel: the real index if reachable, else a local stand-in ---------------------------------
torch_index=https://download.pytorch.org/whl
server_pid=""
index_args=()
trap '[[ -z $server_pid ]] || kill "$server_pid"' EXIT
if [[ $kind == cpu ]] && ! curl -fsS -o /dev/null --max-time 10 "$torch_index/cpu/torch/" 2>/dev/null; then
  wheels=("${PIP_FIND_LINKS:-/opt/wheels}"/torch-"${TORCH_VERSION}"+cpu-*.whl)
  wheel=${wheels[0]}
  if [[ ! -f $wheel ]]; then
    echo "build_local.sh: $torch_index is unreachable and there is no torch ${TORCH_VERSION}+cpu wheel" >&2
    exit 1
  fi
  mkdir -p "$work/index/cpu/torch"
  ln -sf "$wheel" "$work/index/cpu/torch/"
  port=8765
  python3 -m http.server --bind 127.0.0.1 "$port" --directory "$work/index" >"$work/index.log" 2>&1 &
  server_pid=$!
  torch_index=http://127.0.0.1:$port
  log "download.pytorch.org unreachable; serving $(basename "$wheel") at $torch_index/cpu"
fi
[[ $kind != cpu ]] || index_args=(--build-arg "TORCH_INDEX_URL=$torch_index")

# --- 3. the image -----------------------------------------------------------------------------------------------
log "building $image (log: $work/build-$kind.log)"
start=$(date +%s)
# shellcheck disable=SC2086  # BUILD_ARGS: words on purpose
if ! "$root/docker/build.sh" "$kind" --builder buildah --tag "$image" -- "${storage[@]}" --isolation chroot \
    --layers --build-arg "BASE_IMAGE=$base" "${index_args[@]}" ${BUILD_ARGS:-} >"$work/build-$kind.log" 2>&1; then
  tail -n 40 "$work/build-$kind.log" >&2
  echo "build_local.sh: the build FAILED after $(($(date +%s) - start))s; full log: $work/build-$kind.log" >&2
  exit 1
fi
build_s=$(($(date +%s) - start))
[[ ${BUILD_ARGS:-} != *--target* ]] || { log "built the target only (${build_s}s)"; exit 0; }

# --- 4. inside the image ----------------------------------------------------------------------------------------
ctr=$(buildah "${storage[@]}" from "$image")
trap 'buildah "${storage[@]}" rm "$ctr" >/dev/null; [[ -z $server_pid ]] || kill "$server_pid"' EXIT
# --hostname localhost: `buildah run` gives the container a hostname that its /etc/hosts does not resolve, and
# Horovod's Gloo setup then crashes (SIGSEGV in gloo's lookupAddrForHostname). Docker and Kubernetes add the
# container's hostname to its /etc/hosts.
in_image() {
  buildah "${storage[@]}" run --isolation chroot --hostname localhost -v "$root/samples:/samples:ro" "$ctr" -- "$@"
}
log "hvdazure doctor in the image"
in_image hvdazure doctor
start=$(date +%s)
in_image hvdazure run -np 2 --gloo /samples/collectives_check.py --framework torch
if [[ $kind == cpu ]]; then
  in_image hvdazure run -np 2 --mpi /samples/collectives_check.py --framework tensorflow
else  # no TensorFlow in the torch GPU image; no GPU here, so the ranks train on the CPU
  in_image hvdazure run -np 2 --mpi /samples/collectives_check.py --framework torch
  in_image hvdazure run -np 2 --gloo /samples/torch_digits.py --set checkpoint_dir=/tmp/digits
fi
run_s=$(($(date +%s) - start))

size=$(buildah "${storage[@]}" images --format '{{.Size}}' "$image")
log "done: base ${base_s}s, image build ${build_s}s, 2-rank checks ${run_s}s; $image is $size"
