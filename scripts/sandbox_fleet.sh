#!/usr/bin/env bash
# The sandbox service in containers on one host (podman, as root): Redis and the workers on an internal network, the
# API on that network and on a second one, published on a loopback port. docs/containers.md has the layout and why.
#   scripts/sandbox_fleet.sh up [--name N] [--image I] [--port P] [--workers K] [-- WORKER ARGS...]
#   scripts/sandbox_fleet.sh down [--name N]
# Defaults: name rstar2-sbx, image localhost/rstar2-sandbox (scripts/container_build.sh sandbox), port 8088, 2
# workers. WORKER ARGS go to each `python -m rstar2.sandbox.service worker` (e.g. --workers 2 --timeout-s 10).
# Trainers then use sandbox.url: http://127.0.0.1:PORT (another host: publish on an address it reaches, -p below).
#
# The internal network as podman 4.3 / netavark 1.4 (Debian bookworm) makes it is not enough on its own, and the
# probes of tests/test_containers.py found both holes:
#   - its DNS server forwards any name to the host's resolvers: created with --disable-dns, and the workers find
#     Redis by an /etc/hosts entry (--add-host) instead;
#   - the host has the network's gateway address on its bridge, so a container reaches every host service
#     listening on all addresses: packets from that bridge to the host are rejected (iptables INPUT), as is
#     anything it would route elsewhere (FORWARD), until `down`.
set -euo pipefail
cd "$(dirname "$0")/.."
CTR=scripts/container.sh

action=${1:?usage: $0 up|down [--name N] [--image I] [--port P] [--workers K] [-- WORKER ARGS...]}; shift
NAME=rstar2-sbx IMAGE=localhost/rstar2-sandbox PORT=8088 WORKERS=2 WORKER_ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --name) NAME=$2; shift 2 ;;
    --image) IMAGE=$2; shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --) shift; WORKER_ARGS=("$@"); break ;;
    *) echo "sandbox_fleet: unknown option $1" >&2; exit 2 ;;
  esac
done
INT=$NAME-int PUB=$NAME-pub LABEL=rstar2.fleet=$NAME

firewall() {   # firewall -I|-D BRIDGE: the rules that keep the internal network's packets off the host
  local op=$1 br=$2 ipt
  for ipt in iptables ip6tables; do
    command -v $ipt >/dev/null || { [ $ipt = ip6tables ] && continue; echo "sandbox_fleet: iptables missing" >&2; return 1; }
    $ipt "$op" INPUT -i "$br" -j REJECT
    $ipt "$op" FORWARD -i "$br" ! -o "$br" -j REJECT
  done
}

down() {
  local br
  podman ps -aq --filter "label=$LABEL" | xargs -r podman rm -f -t 0 >/dev/null
  for net in "$INT" "$PUB"; do
    podman network exists "$net" || continue
    if [ "$net" = "$INT" ]; then
      br=$(podman network inspect -f '{{.NetworkInterface}}' "$net")
      while firewall -D "$br" 2>/dev/null; do :; done   # each rule as often as `up` may have added it
    fi
    podman network rm -f "$net" >/dev/null
  done
}

if [ "$action" = down ]; then down; exit 0; fi
[ "$action" = up ] || { echo "usage: $0 up|down ..." >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "sandbox_fleet: needs root (the internal network's firewall rules)" >&2; exit 1; }
[ "$($CTR --check)" = podman ] || { echo "sandbox_fleet: needs podman (the docker path is not written)" >&2; exit 1; }
trap 'echo "sandbox_fleet: up failed; removing what it made" >&2; down' ERR

podman network create --label "$LABEL" --internal --disable-dns "$INT" >/dev/null
podman network create --label "$LABEL" --disable-dns "$PUB" >/dev/null
firewall -I "$(podman network inspect -f '{{.NetworkInterface}}' "$INT")"

# every container: no capabilities, no privilege gain, a read-only root (podman mounts tmpfs on /tmp and /run)
HARD=(--label "$LABEL" --cap-drop ALL --security-opt no-new-privileges --read-only)
$CTR run -d --name "$NAME-redis" --network "$INT" "${HARD[@]}" "$IMAGE" \
  redis-server --bind 0.0.0.0 --protected-mode no --save '' --appendonly no >/dev/null
REDIS_IP=$(podman inspect -f "{{(index .NetworkSettings.Networks \"$INT\").IPAddress}}" "$NAME-redis")
for i in $(seq 1 "$WORKERS"); do
  # unmask=/proc/*: bubblewrap mounts a fresh /proc in each call's pid namespace, which the kernel refuses while
  # the container's /proc has paths masked
  $CTR run -d --name "$NAME-worker-$i" --network "$INT" --add-host "redis:$REDIS_IP" "${HARD[@]}" \
    --security-opt 'unmask=/proc/*' "$IMAGE" \
    python -m rstar2.sandbox.service worker --redis redis://redis:6379/0 "${WORKER_ARGS[@]}" >/dev/null
done
$CTR run -d --name "$NAME-api" --network "$PUB" --network "$INT" --add-host "redis:$REDIS_IP" "${HARD[@]}" \
  -p "127.0.0.1:$PORT:8088" "$IMAGE" \
  python -m rstar2.sandbox.service api --redis redis://redis:6379/0 --host 0.0.0.0 --port 8088 >/dev/null

for _ in $(seq 1 120); do
  if python3 -c "import sys, urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/ping', timeout=1)" \
       2>/dev/null; then
    trap - ERR
    echo "http://127.0.0.1:$PORT"
    exit 0
  fi
  sleep 0.5
done
for c in "$NAME-redis" "$NAME-api"; do echo "--- $c" >&2; podman logs --tail 20 "$c" >&2 || true; done
echo "sandbox_fleet: the API did not answer on 127.0.0.1:$PORT within 60 s" >&2
false
