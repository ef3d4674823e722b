#!/usr/bin/env bash
# Install Azurite (Microsoft's Azure Storage emulator, npm package `azurite`, version AZURITE_VERSION from
# versions.env) into the cache outside the repo, for the abfs:// checkpoint tests (tests/storage/). Called by
# scripts/setup_env.sh, and by the tests' fixture when the cache lacks it. Idempotent: a finished install is
# kept in $cache/azurite-VERSION and reused (a test of one file); npm installs into .partial, renamed when
# done, so an interrupted install is never taken for one.
#
# Prints the path of azurite-blob on success. Exits 3 with one line on stderr where Node.js or npm is
# missing (the tests then skip, saying so); any other failure (npm cannot reach its registry) is an error.
#
#   HVDAZURE_CACHE  the cache (default: ~/.cache/hvdazure), shared with the Horovod and mpi4py wheels
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
version=${AZURITE_VERSION:-$(sed -n 's/^AZURITE_VERSION=//p' "$root/versions.env")}
[[ -n $version ]] || { echo "[setup] ERROR: versions.env has no AZURITE_VERSION" >&2; exit 1; }
cache=${HVDAZURE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdazure}
dir=$cache/azurite-$version
bin=$dir/node_modules/.bin/azurite-blob

if [[ -x $bin ]]; then
  echo "$bin"
  exit 0
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "[setup] Node.js or npm not found: Azurite $version (the Blob emulator the abfs:// checkpoint tests" \
    "run against) is not installed and those tests will skip; install them with: apt-get install nodejs npm" >&2
  exit 3
fi
echo "[setup] installing Azurite $version into $dir (npm, about 30 s)" >&2
rm -rf "$dir.partial"
mkdir -p "$dir.partial"
npm install --prefix "$dir.partial" --no-audit --no-fund --omit=dev --loglevel=error "azurite@$version" >&2
rm -rf "$dir"
mv "$dir.partial" "$dir"
echo "$bin"
