#!/usr/bin/env bash
# Sets up everything on a fresh machine and runs the whole test suite (what CI runs).
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${STREAM_SVM_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -e ".[test,kafka]"
"$VENV/bin/python" -m ruff check stream_svm connectors tests benchmarks
exec "$VENV/bin/python" -m pytest "$@"
