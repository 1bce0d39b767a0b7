#!/usr/bin/env bash
# Build one of the images of docker/ (docs/containers.md):
#   scripts/container_build.sh sandbox|cpu [TAG]     default TAG localhost/rstar2-sandbox or localhost/rstar2-cpu
#   scripts/container_build.sh trainer [TAG]         the CUDA image as written (FROM nvidia/cuda, pip from PyPI inside):
#                                                    for a machine with a registry and a GPU; never built here
# sandbox and cpu: on the Debian base of scripts/container_base.sh (RSTAR2_BASE_TAG, default
# localhost/rstar2-base:bookworm; RSTAR2_BASE=python:3.11-slim uses that image instead), with the wheels of
# scripts/container_wheels.sh bound into the build, which itself runs without network (--network none).
# Prints the tag.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:?usage: $0 sandbox|cpu|trainer [TAG]}
TAG=${2:-localhost/rstar2-$WHAT}
CTR=scripts/container.sh
case "$WHAT" in
  sandbox|cpu) ;;
  trainer) $CTR build -f docker/Dockerfile.trainer -t "$TAG" . >&2; echo "$TAG"; exit 0 ;;
  *) echo "usage: $0 sandbox|cpu|trainer [TAG]" >&2; exit 2 ;;
esac
BASE=${RSTAR2_BASE:-$(scripts/container_base.sh "${RSTAR2_BASE_TAG:-localhost/rstar2-base:bookworm}")}
# the base's Python decides which wheels a dependency needs (environment markers; scripts/wheel_closure.py)
IMAGE_PYTHON=$($CTR run --rm --network none "$BASE" python3 -c 'import platform; print(platform.python_version())')
IMAGE_PYTHON=$IMAGE_PYTHON scripts/container_wheels.sh "$WHAT" >&2
# podman: the sandbox image as one image (--layers=false: nothing left behind when a test removes it); the CPU image
# keeps its layers, so a change of code rebuilds only the layers after its pip step
extra=(); [ "$($CTR --check)" = podman ] && [ "$WHAT" = sandbox ] && extra=(--layers=false)
old=$($CTR image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)
$CTR build --network none "${extra[@]}" --build-arg "BASE=$BASE" -f "docker/Dockerfile.$WHAT" -t "$TAG" . >&2
# the image this one replaced, now untagged (not other dangling images: they may be someone else's)
if [ -n "$old" ] && [ "$old" != "$($CTR image inspect -f '{{.Id}}' "$TAG")" ]; then $CTR rmi "$old" >/dev/null 2>&1 || true; fi
echo "$TAG"
