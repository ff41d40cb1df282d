#!/usr/bin/env bash
# Runs the Check suite (build/bin/gddr-tests) from the repository root and
# reports how long it took. Usage: scripts/run-checks.sh [suite...]
set -euo pipefail
cd "$(dirname "$0")/.."
export GDDR_BIN="${GDDR_BIN:-build/bin}"
# Each test case has its own timeout; this is the bound on the whole run.
export CK_DEFAULT_TIMEOUT="${CK_DEFAULT_TIMEOUT:-60}"
status=0
# The install check first, so that Check's summary line closes the output.
if [ $# -eq 0 ]; then
  scripts/test-install.sh || status=$?
fi
timeout 1200 "$GDDR_BIN/gddr-tests" "$@" || status=$?
exit "$status"
