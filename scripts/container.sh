#!/usr/bin/env bash
# The container engine with the flags this kind of machine needs; every other container script goes through it.
#   scripts/container.sh run|build|create ARGS...   podman run|build|create with the flags below, then ARGS
#   scripts/container.sh OTHER ARGS...              podman OTHER ARGS (network, exec, kill, rm, rmi, images, ...)
#   scripts/container.sh --check                    one line naming what is missing when containers cannot run
# Engine: $CONTAINER_ENGINE, else podman, else docker when its daemon answers (the docker path is not tested here).
# With podman (docs/containers.md says why):
#   --runtime runc   crun, podman's default runtime where installed, fails on a cgroup v1 ("hybrid") host
#   --ulimit ...     podman asks the runtime for nofile 1048576 by default, above this machine's hard limit, and the
#                    runtime may not raise a limit here ("setrlimit RLIMIT_NOFILE: Operation not permitted"): a
#                    container gets the host's own limits (nproc also capped at kernel.pid_max, the most allowed here)
set -euo pipefail

engine=${CONTAINER_ENGINE:-}
if [ -z "$engine" ]; then
  if command -v podman >/dev/null 2>&1; then engine=podman
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then engine=docker
  fi
fi

missing() {   # what a machine lacks to run containers, in one line (empty when nothing)
  [ -n "$engine" ] || { echo "no container engine: install podman (scripts/system_deps.sh test) or start docker"; return; }
  [ "$engine" = podman ] || return 0
  command -v runc >/dev/null 2>&1 || { echo "runc missing (Debian package runc): podman's crun fails on this kind of machine"; return; }
  # rootless podman, and the sandbox's bubblewrap inside a container (an unprivileged user there), need them
  [ "$(cat /proc/sys/user/max_user_namespaces 2>/dev/null || echo 0)" -gt 0 ] \
    || { echo "no user namespaces (user.max_user_namespaces is 0)"; return; }
  [ -e /usr/lib/podman/netavark ] || [ -d /usr/lib/cni ] \
    || { echo "no container network stack (Debian package netavark)"; return; }
}

limits() {
  local soft hard pmax
  soft=$(ulimit -Sn); hard=$(ulimit -Hn)
  [ "$hard" = unlimited ] && hard=$(cat /proc/sys/fs/nr_open)
  [ "$soft" = unlimited ] && soft=$hard
  echo "--ulimit nofile=$soft:$hard"
  pmax=$(cat /proc/sys/kernel/pid_max)
  hard=$(ulimit -Hu); [ "$hard" = unlimited ] && hard=$pmax
  [ "$hard" -gt "$pmax" ] && hard=$pmax
  echo "--ulimit nproc=$hard:$hard"
}

if [ "${1:-}" = --check ]; then
  why=$(missing)
  [ -z "$why" ] || { echo "containers cannot run here: $why" >&2; exit 1; }
  echo "$engine"; exit 0
fi
why=$(missing)
[ -z "$why" ] || { echo "scripts/container.sh: containers cannot run here: $why" >&2; exit 1; }
[ $# -ge 1 ] || { echo "usage: $0 run|build|create|OTHER ARGS... | --check" >&2; exit 2; }

cmd=$1; shift
if [ "$engine" = podman ]; then
  case "$cmd" in
    run|create) exec podman --runtime runc "$cmd" $(limits) "$@" ;;
    build)      exec podman --runtime runc build $(limits) "$@" ;;
    *)          exec podman --runtime runc "$cmd" "$@" ;;
  esac
fi
exec "$engine" "$cmd" "$@"
