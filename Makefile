# make run   : set up the virtual environment (pinned packages) and run the whole pipeline on config.yaml
# make test  : set up and run the test suite (unit tests + the tiny end-to-end workflow)
# Both first install missing Debian packages (scripts/system_deps.sh: bubblewrap; for tests also redis-server, chromium).
PYTHON ?= python3
VENV   ?= .venv
CORES  ?= 2
BIN     = $(VENV)/bin

.PHONY: setup run test clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml scripts/install_python.sh
	$(PYTHON) -m venv $(VENV)
	scripts/install_python.sh $(BIN)/pip
	touch $@

run: setup
	scripts/system_deps.sh run
	HF_HUB_OFFLINE=1 $(BIN)/snakemake --cores $(CORES)

test: setup
	scripts/system_deps.sh test
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -ra

clean:
	rm -rf results logs .snakemake
