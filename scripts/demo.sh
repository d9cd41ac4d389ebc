#!/usr/bin/env bash
# Set up everything (idempotent) and run Kiln's main job: `kiln demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kiln demo "$@"
