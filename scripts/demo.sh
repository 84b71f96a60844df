#!/usr/bin/env bash
# The whole demo in one command on a fresh machine: sets up .venv like scripts/test.sh, then
# runs `stream-svm demo` (embedded broker, Bananas replayed into a topic, the daemon until the
# stream is drained, /metrics served meanwhile, and a summary).
# Usage: bash scripts/demo.sh [demo options, e.g. --limit 2000 --metrics-port 0]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
exec "$VENV/bin/stream-svm" --log-level WARNING demo "$@"
