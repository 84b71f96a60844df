#!/usr/bin/env bash
# Sets up everything on a fresh machine and runs the whole test suite (what CI runs).
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
"$VENV/bin/python" -m ruff check stream_svm connectors tests benchmarks
# Two workers (pytest-xdist), each with its own embedded broker: most broker and subprocess
# tests wait on timeouts, so two share two cores well. Arguments after these win (-n 0: one
# process).
exec "$VENV/bin/python" -m pytest -n 2 --dist worksteal "$@"
