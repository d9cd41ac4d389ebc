#!/usr/bin/env bash
# Set up everything (idempotent) and run Kiln's test suite.
#   bash scripts/test.sh                   # the whole suite (what CI runs), in 2 processes (pytest-xdist)
#   bash scripts/test.sh -m "not slow"     # a quicker selection: extra arguments go to pytest
#   KILN_TEST_WORKERS=0 bash scripts/test.sh   # in one process (KILN_TEST_WORKERS=4: four)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
exec .venv/bin/python -m pytest -q -n "${KILN_TEST_WORKERS:-2}" "$@"
