#!/usr/bin/env bash
# Assemble what the GPU check (scripts/gpu_check.sh) carries to a machine without internet, in .gpu-check/
# (ignored by git; the device's `carry` names it), and print its size, the size of everything that travels,
# and the command line to run the check with. Run it here, where PyPI is reachable.
#
#   scripts/gpu_check_bundle.sh
#
#   HOROVOD_SDIST      an sdist already at hand, copied instead of downloaded
#   GPU_CHECK_WHEELS   "NAME==VERSION ..." pure-Python wheels to carry as well (none needed today: the GPU
#                      machine's Python has every package hvdazure's training path imports; gpu_check.sh
#                      installs any .gpu-check/wheels/*.whl before its rows)
# The working tree travels as it is (hvdazure runs from it, on PYTHONPATH): the whole must stay under 64 MiB.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
# shellcheck source=/dev/null
source versions.env
python=${PYTHON:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
bundle=.gpu-check
limit=$((64 * 1024 * 1024))
mkdir -p "$bundle"

sdist=$bundle/horovod-$HOROVOD_VERSION.tar.gz
if [[ -n ${HOROVOD_SDIST:-} ]]; then
  cp "$HOROVOD_SDIST" "$sdist"
elif [[ ! -f $sdist ]]; then
  "$python" -m pip download --quiet --no-deps --no-binary :all: "horovod==$HOROVOD_VERSION" -d "$bundle"
fi
tar -tzf "$sdist" >/dev/null || { echo "gpu_check_bundle.sh: $sdist is not a readable sdist" >&2; exit 1; }

rm -rf "$bundle/wheels"
if [[ -n ${GPU_CHECK_WHEELS:-} ]]; then
  read -ra wheels <<<"$GPU_CHECK_WHEELS"
  "$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$bundle/wheels" "${wheels[@]}"
fi

bundle_bytes=$(du -sb "$bundle" | cut -f1)
# what travels: tracked files and untracked ones git does not ignore (as they are now), and the bundle
tree_bytes=$( { git ls-files -z --cached --others --exclude-standard; } | xargs -0 -r du -cb 2>/dev/null \
  | awk '$2 == "total" {s += $1} END {print s + 0}')
total=$((bundle_bytes + tree_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "gpu_check_bundle.sh: $bundle/ $(mib "$bundle_bytes"):"
(cd "$bundle" && find . -type f -printf '  %p %s B\n' | sort)
echo "the working tree $(mib "$tree_bytes"); all that travels $(mib "$total") of 64 MiB"
if ((total > limit)); then
  echo "gpu_check_bundle.sh: over 64 MiB: carry less" >&2
  exit 1
fi
cat <<'EOF'
Run the check with the device tool's `run` (one call, 6 minutes, which leaves a second fresh start and run
within a 15-minute device budget):
  run(command="PYTHONUNBUFFERED=1 bash scripts/gpu_check.sh \"$OUT\" 2>&1", carry=[".gpu-check"], timeout_s=360)
The table is at the end of the output and in $OUT/gpu_check.md (JSON: gpu_check.json; every job's output:
gpu_check.log; the build's: horovod-build.log).
EOF
