#!/usr/bin/env bash
# The CPU workflow image on the tiny workflow, beside the same run outside it (`make container-cpu`):
#   scripts/container_cpu_run.sh [LOG]     default LOG docs/measurements/containers/cpu-tiny.txt
# Builds localhost/rstar2-cpu (scripts/container_build.sh cpu), runs `snakemake --cores 2 --configfile
# configs/tiny.yaml` in it without network and with results/ mounted, runs the same in a scratch copy of the workflow
# with .venv, compares the two results folders (rstar2 compare-runs: every artifact but timings) and the reports'
# text, and writes the log: machine, commit, build and run times, image size, the report's lead lines.
# The image stays (remove it with scripts/container.sh rmi localhost/rstar2-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=${1:-docs/measurements/containers/cpu-tiny.txt}
TAG=localhost/rstar2-cpu
CTR=scripts/container.sh
WORK=$(mktemp -d /tmp/rstar2-cpu-run.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.0f}')"; }

load=$(cut -d' ' -f1-3 /proc/loadavg)
t0=$(now)
scripts/container_build.sh cpu "$TAG" >/dev/null; build_s=$(secs "$t0" "$(now)")
size=$($CTR image inspect -f '{{.Size}}' "$TAG")

mkdir -p "$WORK/inside/results"
chown 10001:10001 "$WORK/inside/results"   # the image's user
t0=$(now)
$CTR run --rm --network none --security-opt 'unmask=/proc/*' -v "$WORK/inside/results:/app/results" "$TAG" \
  snakemake --cores 2 --configfile configs/tiny.yaml >"$WORK/inside.log" 2>&1 \
  || { tail -30 "$WORK/inside.log" >&2; echo "container_cpu_run: the run in the image failed" >&2; exit 1; }
inside_s=$(secs "$t0" "$(now)")

.venv/bin/python -c "import sys; from pathlib import Path; from rstar2.reproduce import scratch_copy; \
scratch_copy(Path('.').resolve(), Path(sys.argv[1]))" "$WORK/outside"
t0=$(now)
(cd "$WORK/outside" && HF_HUB_OFFLINE=1 "$OLDPWD/.venv/bin/python" -m snakemake --cores 2 --configfile configs/tiny.yaml) \
  >"$WORK/outside.log" 2>&1 || { tail -30 "$WORK/outside.log" >&2; echo "container_cpu_run: the run outside failed" >&2; exit 1; }
outside_s=$(secs "$t0" "$(now)")

compared=$(.venv/bin/python -m rstar2.cli compare-runs "$WORK/inside/results" "$WORK/outside/results" 2>&1) && same=yes || same=no
# the reports' text: what may differ is the line naming the code and config files (paths, hashes) and timings
report_diff=$(diff "$WORK/outside/results/report/summary.md" "$WORK/inside/results/report/summary.md" || true)

mkdir -p "$(dirname "$LOG")"
{
  echo "# scripts/container_cpu_run.sh: the CPU image on configs/tiny.yaml, and the same run outside it"
  echo "date: $(date -u +%FT%TZ); commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- rstar2 docker scripts workflow configs || echo ' (working tree differs)')"
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (family $(grep -m1 'cpu family' /proc/cpuinfo \
    | cut -d: -f2 | xargs) model $(grep -m1 '^model' /proc/cpuinfo | cut -d: -f2 | xargs); avx512f: $(grep -qw avx512f \
    /proc/cpuinfo && echo yes || echo no)), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; load average at start $load"
  echo "engine: $(podman --version 2>/dev/null || echo "$($CTR --check)"), runtime runc; image $TAG $((size / 1000000)) MB"
  echo "build (scripts/container_build.sh cpu: wheels, base and layers as found in build/ and podman's store): ${build_s} s"
  echo "tiny workflow in the image (--network none, results/ mounted): ${inside_s} s"
  echo "tiny workflow outside (.venv, scratch copy): ${outside_s} s"
  echo "results identical: $same"
  echo "$compared" | sed 's/^/  /'
  echo
  echo "## report lead lines (the run in the image: results/report/summary.md)"
  head -n 20 "$WORK/inside/results/report/summary.md"
  echo
  echo "## the two reports' summary.md, outside (<) against inside (>)"
  echo "${report_diff:-(identical)}"
  echo
  echo "## the run in the image: Snakemake's last lines"
  tail -n 5 "$WORK/inside.log"
} >"$LOG"
cat "$LOG"
[ "$same" = yes ]
