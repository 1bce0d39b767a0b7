#!/usr/bin/env bash
# Two "nodes" on one machine: two network namespaces joined by one veth pair, each with its own address and host
# name, for testing multi-node launches without a cluster (tests/test_two_nodes.py). Needs root and iproute2.
#   scripts/netns_nodes.sh up DIR          create the namespaces; writes DIR/nodes.env (NS_i, HOST_i, ADDR_i)
#   scripts/netns_nodes.sh on DIR I CMD..  run CMD on node I: in its network namespace, in new UTS and mount
#                                          namespaces (host name HOST_I; DIR/hosts, naming both nodes, over /etc/hosts)
#   scripts/netns_nodes.sh down DIR        end every process left in the namespaces, delete them (idempotent)
# Node i is host rstar2-node<i> at 10.249.0.<i+1>/24 on the link eth0; there is no route out of the pair, so the
# traffic between the nodes stays inside the two namespaces. The namespaces are named rstar2-<random>-n<i> (several
# pairs may exist at once). `nsenter --net` rather than `ip netns exec`, which mounts a new /sys without the cgroup
# file systems that slurmd needs.
set -euo pipefail
die() { echo "netns_nodes: $*" >&2; exit 1; }
verb=${1:-}; dir=${2:-}
[ -n "$verb" ] && [ -n "$dir" ] || die "usage: $0 up|down DIR  |  $0 on DIR I CMD..."
ENV="$dir/nodes.env"

up() {
  [ "$(id -u)" -eq 0 ] || die "cannot start: needs root (ip netns add)"
  command -v ip >/dev/null 2>&1 || die "cannot start: ip (iproute2) missing: scripts/system_deps.sh test installs it"
  [ -f "$ENV" ] && down
  mkdir -p "$dir"
  local id i ns
  id=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
  # veth names are at most 15 characters and machine-wide until moved: made unique here, renamed eth0 inside
  {
    for i in 0 1; do echo "NS_$i=rstar2-$id-n$i"; echo "HOST_$i=rstar2-node$i"; echo "ADDR_$i=10.249.0.$((i + 1))"; done
  } >"$ENV"
  # shellcheck source=/dev/null
  . "$ENV"
  printf '127.0.0.1 localhost\n%s %s\n%s %s\n' "$ADDR_0" "$HOST_0" "$ADDR_1" "$HOST_1" >"$dir/hosts"
  for i in 0 1; do
    ns="NS_$i"; ip netns add "${!ns}" || die "cannot start: ip netns add ${!ns} failed"
  done
  ip link add "v$id-0" type veth peer name "v$id-1" || die "cannot start: ip link add (veth) failed"
  for i in 0 1; do
    ns="NS_$i"; addr="ADDR_$i"
    ip link set "v$id-$i" netns "${!ns}"
    ip -n "${!ns}" link set "v$id-$i" name eth0
    ip -n "${!ns}" addr add "${!addr}/24" dev eth0
    ip -n "${!ns}" link set eth0 up
    ip -n "${!ns}" link set lo up
  done
  echo "netns_nodes: $HOST_0 ($ADDR_0, netns $NS_0) <-> $HOST_1 ($ADDR_1, netns $NS_1)" >&2
}

on() {
  [ -f "$ENV" ] || die "no nodes in $dir (run: $0 up $dir)"
  # shellcheck source=/dev/null
  . "$ENV"
  local i=${1:?node index}; shift
  local ns="NS_$i" host="HOST_$i"
  [ -n "${!ns:-}" ] || die "no node $i in $ENV"
  # shellcheck disable=SC2016  # expanded by the inner shell
  exec nsenter --net="/run/netns/${!ns}" unshare --uts --mount \
    sh -c 'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"' "${!host}" "$dir/hosts" "$@"
}

down() {
  [ -f "$ENV" ] || return 0
  # shellcheck source=/dev/null
  . "$ENV"
  local i ns pids n
  for i in 0 1; do
    ns="NS_$i"
    ip netns list | grep -qw "${!ns}" || continue
    # every process in the namespace was started on this node (by `on`): TERM, then KILL what is left after 5 s
    for sig in TERM KILL; do
      pids=$(ip netns pids "${!ns}" 2>/dev/null || true)
      [ -z "$pids" ] && break
      # shellcheck disable=SC2086
      kill -s "$sig" $pids 2>/dev/null || true
      for n in $(seq 1 20); do [ -z "$(ip netns pids "${!ns}" 2>/dev/null)" ] && break; sleep 0.25; done
    done
    ip netns del "${!ns}" || die "could not delete netns ${!ns}"   # deletes its end of the veth pair, so both
  done
  rm -f "$ENV" "$dir/hosts"
}

case "$verb" in
  up) up ;;
  on) shift 2; on "$@" ;;
  down) down ;;
  *) die "unknown verb $verb (up | on | down)" ;;
esac
