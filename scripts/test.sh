#!/usr/bin/env bash
# Set up everything (idempotent) and run Kiln's test suite.
#   bash scripts/test.sh                   # the whole suite (what CI runs; ~14 minutes here)
#   bash scripts/test.sh -m "not slow"     # a quicker selection: extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
exec .venv/bin/python -m pytest -q "$@"
