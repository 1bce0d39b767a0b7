#!/usr/bin/env bash
# A base image made from Debian's packages, for machines that reach Debian's mirror but no image registry:
#   scripts/container_base.sh [TAG]      (default localhost/rstar2-base:bookworm; prints the tag)
# Debian bookworm, minbase, with python3 3.11 and venv, bubblewrap (the sandbox's namespaces) and redis-server
# (the sandbox service's queue): what docker/Dockerfile.* install on python:3.11-slim, their default BASE. The images
# are built on it with --build-arg BASE=TAG (scripts/container_build.sh does).
# mmdebstrap makes the root file system once (about a minute); the tarball is kept in build/containers/ and a later
# call with the image gone imports it again (seconds). Set RSTAR2_BASE_REFRESH=1 to make it anew (security updates).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:-localhost/rstar2-base:bookworm}
PACKAGES=python3,python3-venv,bubblewrap,redis-server
DIR=build/containers
TAR=$DIR/debian-bookworm-base.tar
CTR=scripts/container.sh

mkdir -p "$DIR"
exec 9>"$DIR/.base.lock"   # one maker at a time (two test runs, or a test and a build)
flock 9
if [ -z "${RSTAR2_BASE_REFRESH:-}" ] && $CTR image inspect "$TAG" >/dev/null 2>&1; then echo "$TAG"; exit 0; fi
if [ -n "${RSTAR2_BASE_REFRESH:-}" ] || [ ! -s "$TAR" ]; then
  command -v mmdebstrap >/dev/null || { echo "container_base: mmdebstrap missing (scripts/system_deps.sh test)" >&2; exit 1; }
  hooks=()
  # dpkg without fsync; the root file system in memory: 100 -> 62 s on 2 busy cores
  command -v eatmydata >/dev/null && hooks=(--hook-directory=/usr/share/mmdebstrap/hooks/eatmydata)
  tmp=${TMPDIR:-/tmp}; [ -w /dev/shm ] && tmp=/dev/shm
  echo "container_base: mmdebstrap bookworm ($PACKAGES) -> $TAR" >&2
  rm -rf "$TAR.part"
  TMPDIR=$tmp mmdebstrap --quiet --format=tar --variant=minbase "${hooks[@]}" --include="$PACKAGES" bookworm "$TAR.part"
  mv "$TAR.part" "$TAR"
fi
$CTR import --quiet --change 'CMD ["python3"]' "$TAR" "$TAG" >/dev/null
echo "$TAG"
