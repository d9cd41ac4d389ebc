#!/usr/bin/env bash
# Set up everything (idempotent) and run Kiln's test suite.
#   bash scripts/test.sh              # the suite CI runs
#   bash scripts/test.sh -m slow      # extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
if [ $# -eq 0 ]; then set -- -m "not slow"; fi
exec .venv/bin/python -m pytest -q "$@"
