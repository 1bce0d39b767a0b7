#!/usr/bin/env bash
# Run by `snakemake --use-conda` inside the new environment, from the workflow directory: every rule's packages,
# the same as `make setup` installs (requirements.txt, the --no-deps wheels, the rstar2 package).
set -euo pipefail
scripts/install_python.sh pip
