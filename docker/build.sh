#!/usr/bin/env bash
# Build an hvdazure image with every pin from versions.env passed as --build-arg, locally or in Azure.
#
#   docker/build.sh cpu|torch-gpu|tf-gpu [options] [-- extra arguments for the builder]
#
#   --builder docker|podman|buildah|acr   what builds it (default: docker). acr runs `az acr build`: the build
#                                          happens in Azure Container Registry, nothing is built here.
#   --registry NAME                        the registry for --builder acr (NAME.azurecr.io)
#   --tag IMAGE:TAG                        default: hvdazure-<kind>:<hvdazure version>
#   --push                                 push the tag after a local build (acr always stores the image)
#   --dry-run                              print the command instead of running it
#
# The build context is a small staging folder holding only what the Dockerfiles copy (versions.env,
# requirements/, the two build scripts, the package, docker/), so a multi-GB .venv is never uploaded.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

variant=${1:-}
[[ $variant =~ ^(cpu|torch-gpu|tf-gpu)$ ]] || usage
shift
builder=docker registry="" tag="" push=0 dry_run=0 extra=()
while (($#)); do
  case $1 in
    --builder) builder=${2:?--builder needs a value}; shift 2 ;;
    --registry) registry=${2:?--registry needs a value}; shift 2 ;;
    --tag) tag=${2:?--tag needs a value}; shift 2 ;;
    --push) push=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    --) shift; extra=("$@"); break ;;
    *) usage ;;
  esac
done
[[ $builder =~ ^(docker|podman|buildah|acr)$ ]] || { echo "build.sh: unknown builder '$builder'" >&2; exit 2; }
[[ $builder != acr || -n $registry ]] || { echo "build.sh: --builder acr needs --registry NAME" >&2; exit 2; }

dockerfile=docker/$variant/Dockerfile
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$root/hvdazure/_version.py")
tag=${tag:-hvdazure-$variant:$version}

# Every versions.env key that this Dockerfile declares as an ARG, with versions.env's value.
build_args=()
while IFS='=' read -r key value; do
  [[ $key =~ ^[A-Z_]+$ ]] || continue
  grep -q "^ARG $key=" "$root/$dockerfile" && build_args+=(--build-arg "$key=$value")
done <"$root/versions.env"
revision=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
[[ -z $(git -C "$root" status --porcelain 2>/dev/null) ]] || revision+="-dirty"
build_args+=(--build-arg "HVDAZURE_VERSION=$version" --build-arg "VCS_REF=$revision"
  --build-arg "BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)")

# Run from inside the context: `az acr build --file` takes a path relative to it.
case $builder in
  acr) # ACR Tasks default to a 1-hour timeout; a GPU image's Horovod build alone can take most of that.
    cmd=(az acr build --registry "$registry" --image "$tag" --file "$dockerfile" --platform linux/amd64
      --timeout 10800 "${build_args[@]}" "${extra[@]}" .) ;;
  docker) cmd=(docker build --file "$dockerfile" --tag "$tag" "${build_args[@]}" "${extra[@]}" .) ;;
  *) # podman and buildah default to the OCI format, which ignores SHELL (bash with pipefail) in RUN steps.
    cmd=("$builder" build --format docker --file "$dockerfile" --tag "$tag" "${build_args[@]}" "${extra[@]}" .) ;;
esac

if ((dry_run)); then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
tar -C "$root" -cf - --exclude=__pycache__ versions.env requirements scripts/build_horovod.sh \
  scripts/pypi_cuda_toolkit.sh setup.py \
  pyproject.toml README.md hvdazure docker | tar -C "$context" -xf -
echo "building $tag with $builder from $dockerfile"
(cd "$context" && "${cmd[@]}")
if ((push)) && [[ $builder != acr ]]; then
  "$builder" push "$tag"
fi
