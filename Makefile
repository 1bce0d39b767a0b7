# make run   : set up the virtual environment (pinned packages) and run the whole pipeline on config.yaml
#              (make run CONFIG=my.yaml: merged over config.yaml, as snakemake --configfile my.yaml; several: "a.yaml b.yaml")
# make test  : set up and run the test suite (unit tests + the tiny end-to-end workflow, the docs site in strict mode)
# make test-fast: the tests not marked slow, for development
# Both first install missing Debian packages (scripts/system_deps.sh: bubblewrap; for tests also redis-server, chromium,
#              and podman, runc, mmdebstrap for the container tests).
PYTHON ?= python3
VENV   ?= .venv
CORES  ?= 2
BIN     = $(VENV)/bin

.PHONY: setup setup-test run test test-fast clean

setup: $(VENV)/.installed

$(VENV)/.installed: requirements.txt pyproject.toml scripts/install_python.sh
	$(PYTHON) -m venv $(VENV)
	scripts/install_python.sh $(BIN)/pip
	touch $@

# vLLM's CPU build and its runtime dependencies, fully pinned: a test dependency, so that the tests run the real
# engine (see the file: wheels that do not load against the CPU torch are left out, and nothing may move a pin
# of requirements.txt). `make run` does not need it (the CPU default engine is hf; 37 s of set-up on 2 cores);
# GPU machines take the gpu extra instead.
setup-test: $(VENV)/.installed-vllm $(VENV)/.installed-docs

$(VENV)/.installed-vllm: $(VENV)/.installed requirements-vllm.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-vllm.txt
	touch $@

# MkDocs for the documentation site, which tests/test_docs.py builds in strict mode (pinned, no-deps as above).
$(VENV)/.installed-docs: $(VENV)/.installed requirements-docs.txt
	$(BIN)/pip install --quiet --no-deps -r requirements-docs.txt
	touch $@

run: setup
	scripts/system_deps.sh run
	HF_HUB_OFFLINE=1 $(BIN)/snakemake --cores $(CORES) $(if $(CONFIG),--configfile $(CONFIG))

# Every test, with each test's time in build/test-junit.xml (scripts/test_durations.py save keeps a reference run's
# under docs/measurements/tests/, with the machine it ran on). Two pytest-xdist workers: a module stays on one
# worker, the longest modules start first (tests/conftest.py); many tests wait on subprocesses, a cluster or a
# server, so two share 2 cores well. TEST_WORKERS=0 runs them in one process.
TEST_WORKERS ?= 2
test: setup-test
	scripts/system_deps.sh test
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -ra --durations=20 --junitxml=build/test-junit.xml -n $(TEST_WORKERS)

# For development: the tests not marked slow (no workflow, cluster, learning or container runs). CI runs `make test`.
test-fast: setup-test
	scripts/system_deps.sh test
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -ra -m "not slow" --durations=10

clean:
	rm -rf results logs .snakemake

# The CPU workflow image built from Debian's packages and run on the tiny workflow beside the same run outside it
# (docs/containers.md; 17 min on 2 busy cores, too long for `make test`, which builds and runs the sandbox image):
# its log goes to docs/measurements/containers/cpu-tiny.txt.
.PHONY: container-cpu
container-cpu: setup
	scripts/system_deps.sh test
	scripts/container_cpu_run.sh
