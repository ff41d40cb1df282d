#!/usr/bin/env bash
# Runs the checks from the repository root: a second make has nothing to do,
# the layering rules hold (scripts/check-layers.sh: the daemon holds no
# client code, no include or call cycle among the files of a folder, no
# source file over 700 lines), the repository stands alone
# (scripts/test-docs.sh: no citation of a file outside it, every docs/design.md section cited exists), the systemd unit's
# hardening (scripts/test-unit.sh), the demo's progress
# loop (scripts/test-lib.sh), the Grafana dashboard's queries
# (scripts/test-dashboard.sh), the step-time model's invariants and its
# validation against measured step times (scripts/scalesim.py --check), the README's
# by-hand block (scripts/test-readme.sh), the install check (with every C
# block of the docs compiled), the ABI test (tests/abi/run.sh: a program
# built against the first gddr.h runs on this library), the manual pages (scripts/test-man.sh: man -l
# renders each, every option and INI key named), the wheel (scripts/test-wheel.sh:
# pip installs it offline into a venv, gddr imports and trains with the
# library inside it), the Debian packages (scripts/test-deb.sh: lintian-clean,
# installed into a scratch root, C and python3-gddr through them), the protocol
# test (tests/protocol: the wire spoken from Python without libgddr-client,
# hostile traffic included) and libgddr-client against a lying server
# (scripts/fuzz-client.sh, 20 s),
# the Python package's tests (python/tests: gddr and gddr.torch over
# libgddr-client) with the language-model example's smoke run
# (scripts/experiment-lm.sh --quick: gddr-ps with Adam, Python workers, an
# observer), the network smoke test (scripts/experiment-network.sh
# --smoke: two namespaces, a rate-limited veth, one short run; skipped with
# the reason when not root or without ip netns), three minutes of the soak
# (scripts/soak.py: faults against a sharded CURVE pair with the push log
# on; docs/soak.md), a minute of it in sync mode (scripts/soaksync.py) and
# the Check suite
# (build/bin/gddr-tests).
#
# Usage: scripts/run-checks.sh [suite...]
#   no suite     everything
#   protocol     the protocol test (may be named with Check suites)
#   python       the Python package's tests (likewise)
#   network      the network smoke test (likewise)
#   soak         the 3-minute soak and a minute of the sync soak (likewise;
#                SOAK_S and SOAK_SYNC_S to change)
#   other names  those Check suites only
set -euo pipefail
cd "$(dirname "$0")/.."
export GDDR_BIN="${GDDR_BIN:-build/bin}"
# Each test case has its own timeout; this is the bound on the whole run.
export CK_DEFAULT_TIMEOUT="${CK_DEFAULT_TIMEOUT:-60}"
status=0
protocol=0
python=0
network=0
soak=0
suites=()
for s in "$@"; do
  case "$s" in
    protocol) protocol=1 ;;
    python) python=1 ;;
    network) network=1 ;;
    soak) soak=1 ;;
    *) suites+=("$s") ;;
  esac
done
# The install check and the protocol test first, so that Check's summary
# line closes the output.
if [ $# -eq 0 ]; then
  # The build is complete (make check built it): a second make must have
  # nothing to do but say which kernels it builds, and relink nothing.
  build=$(dirname "$GDDR_BIN")
  san=()
  [ "$build" = build ] || san=(SANITIZER="$(basename "$build")")
  again=$(unset MAKEFLAGS MAKELEVEL MFLAGS; make --no-print-directory -n all ${san[@]+"${san[@]}"} |
          grep -v 'CUDA' || true)
  if [ -n "$again" ]; then
    echo "run-checks: FAIL: a second make would run:" >&2
    echo "$again" >&2
    status=1
  else
    echo "run-checks: a second make has nothing to do"
  fi
  scripts/check-layers.sh "$build" || status=$?
  scripts/test-docs.sh || status=$?
  scripts/test-unit.sh || status=$?
  scripts/test-lib.sh || status=$?
  scripts/test-dashboard.sh || status=$?
  scripts/test-readme.sh || status=$?
  scripts/test-install.sh || status=$?
  tests/abi/run.sh || status=$?
  scripts/test-man.sh || status=$?
  scripts/test-wheel.sh || status=$?
  scripts/test-deb.sh || status=$?
  # the cluster-scale step-time model's invariants and validation (~2 s)
  out=$(timeout 60 /usr/bin/python3 scripts/scalesim.py --check 2>&1) || { echo "$out"; status=1; }
  echo "$out" | tail -1
  protocol=1
  python=1
  network=1
  soak=1
fi
if [ "$protocol" -eq 1 ]; then
  # Debian's python3 explicitly: it has python3-zmq, python3-protobuf and
  # python3-pytest (a python3 earlier in PATH may be another build).
  timeout 600 /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/protocol || status=$?
  # and the other way round: libgddr-client against a lying server (20 s)
  scripts/fuzz-client.sh --seconds 20 || status=$?
fi
if [ "$python" -eq 1 ]; then
  # The package loads the library of this build ($GDDR_BIN/../lib); -rs
  # prints why a test was skipped (no torch, no GPU).
  timeout 600 /usr/bin/python3 -m pytest -q -rs -p no:cacheprovider python/tests || status=$?
  timeout 300 scripts/experiment-lm.sh --quick || status=$?
  timeout 300 scripts/experiment-optim.sh --quick > /dev/null || status=$?
fi
if [ "$network" -eq 1 ]; then
  timeout 120 scripts/experiment-network.sh --smoke || status=$?
fi
if [ "$soak" -eq 1 ]; then
  # Three minutes of faults (scripts/soak.py, docs/soak.md): kill -9 and
  # SIGSTOP of servers and workers, malformed traffic, a conservation
  # worker; push_log = always, so nothing acknowledged may be lost.
  timeout 900 env SOAK_S="${SOAK_S:-180}" /usr/bin/python3 scripts/soak.py --push-log always \
    --drain-s 60 --json "$(dirname "$GDDR_BIN")/soak-check.json" || status=$?
  # A minute of the same faults in sync mode (scripts/soaksync.py): the
  # steps must go on once they stop, and no step may be torn.
  timeout 600 /usr/bin/python3 scripts/soaksync.py --seconds "${SOAK_SYNC_S:-60}" --progress-s 90 \
    --json "$(dirname "$GDDR_BIN")/soaksync-check.json" || status=$?
fi
if [ $# -eq 0 ] || [ "${#suites[@]}" -gt 0 ]; then
  timeout 1200 "$GDDR_BIN/gddr-tests" ${suites[@]+"${suites[@]}"} || status=$?
fi
exit "$status"
