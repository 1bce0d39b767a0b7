#!/usr/bin/env bash
# Install the Debian packages the given purpose needs, only those missing (apt; sudo when not root).
#   run : bubblewrap (the sandbox's namespaces); fonts for the report (its HTML pages and figures show model
#         output, which holds any script: DejaVu for Latin, Greek, Cyrillic and math signs, WenQuanYi Micro Hei for
#         CJK and Hangul, Noto for Thai, Ethiopic, Arabic, Devanagari ...; without them a browser draws boxes)
#   test: the same, redis-server (sandbox service tests), chromium (HTML report test)
set -euo pipefail
# what shows that a package is installed: a command, or a file
declare -A CMD=([bubblewrap]=bwrap [redis-server]=redis-server [chromium]=chromium)
declare -A FILE=([fonts-dejavu-core]=/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
                 [fonts-wqy-microhei]=/usr/share/fonts/truetype/wqy/wqy-microhei.ttc
                 [fonts-noto-core]=/usr/share/fonts/truetype/noto/NotoSansThai-Regular.ttf)
FONTS=(fonts-dejavu-core fonts-wqy-microhei fonts-noto-core)
case "${1:-run}" in
  run)  wanted=(bubblewrap "${FONTS[@]}") ;;
  test) wanted=(bubblewrap redis-server chromium "${FONTS[@]}") ;;
  *)    echo "usage: $0 run|test" >&2; exit 2 ;;
esac
# the containers of tests/test_containers.py (docs/containers.md): podman with runc (crun fails here), its network stack
# and iptables (the fleet's firewall rules); mmdebstrap makes the base image from Debian's packages, eatmydata faster
CMD+=([podman]=podman [runc]=runc [netavark]=/usr/lib/podman/netavark [iptables]=iptables [mmdebstrap]=mmdebstrap
      [eatmydata]=eatmydata)
[ "${1:-run}" = test ] && wanted+=(podman runc netavark iptables mmdebstrap eatmydata)
# the two-node SLURM cluster of tests/test_two_nodes.py (scripts/netns_slurm.sh): network namespaces and veth pairs
# (iproute2), munge and the SLURM daemons and clients (scripts/local_slurm.sh installs the same when it starts)
CMD+=([iproute2]=ip [munge]=/usr/sbin/munged [slurmctld]=/usr/sbin/slurmctld [slurmd]=/usr/sbin/slurmd
      [slurm-client]=sbatch)
[ "${1:-run}" = test ] && wanted+=(iproute2 munge slurmctld slurmd slurm-client)
missing=()
for pkg in "${wanted[@]}"; do
  if [ -n "${CMD[$pkg]:-}" ]; then command -v "${CMD[$pkg]}" >/dev/null 2>&1 || missing+=("$pkg")
  else [ -e "${FILE[$pkg]}" ] || missing+=("$pkg"); fi
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system_deps: please install ${missing[*]} (no apt-get here)" >&2; exit 1
fi
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "system_deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
