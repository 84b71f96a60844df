#!/usr/bin/env bash
# Sets up everything on a fresh machine and runs the whole test suite (what CI runs).
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
"$VENV/bin/python" -m ruff check stream_svm connectors tests benchmarks
exec "$VENV/bin/python" -m pytest "$@"
