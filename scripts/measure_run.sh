#!/usr/bin/env bash
# A timed `make run` whose source is kept: docs/measurements/NAME (scripts/measurements.py save), then the
# its row regenerated from it (scripts/measurements.py table). Run from a fresh clone for set-up included.
#   scripts/measure_run.sh NAME [make arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${1:?usage: $0 NAME [make arguments...]}; shift
start=$(date +%s)
make run "$@" 2>&1 | tee "/tmp/measure_run_$NAME.log"
wall=$(( $(date +%s) - start ))
.venv/bin/python scripts/measurements.py save "$NAME" --wall-s "$wall" --command "make run $*"
.venv/bin/python scripts/measurements.py table "$NAME"
