#!/bin/bash
# Time a first `make run` as a new user gets it: a fresh clone of this repository and an empty
# timebill cache; every output line is stamped with the seconds since the command started.
#   bash benchmarks/first_start.sh [OUT_LOG]   (default /tmp/make_run_first_start.log)
# The clone is of branch main (BRANCH=... for another). COLD_PIP=1: pip's cache empty too
# (an emptied /tmp/fresh_pip_cache), as on a machine that never installed these wheels.
# The demo leaves a predictor build running in the background: its pid is in
# /tmp/fresh_cache/rlp/build.lock (the next run stops it first).
set -u
out="${1:-/tmp/make_run_first_start.log}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# A previous run's background predictor build (its own process group) must not run beside.
if pid=$(cat /tmp/fresh_cache/rlp/build.lock 2>/dev/null); then kill -- -"$pid" 2>/dev/null; fi
rm -rf /tmp/fresh /tmp/fresh_cache /tmp/fresh_pip_cache
git clone -q -b "${BRANCH:-main}" "$repo" /tmp/fresh && cd /tmp/fresh || exit 1
export TIMEBILL_CACHE=/tmp/fresh_cache
if [[ "${COLD_PIP:-0}" == 1 ]]; then export PIP_CACHE_DIR=/tmp/fresh_pip_cache; fi
start=$(date +%s.%N)
make run 2>&1 | while IFS= read -r line; do
  printf '%7.1f %s\n' "$(echo "$(date +%s.%N) - $start" | bc)" "$line"; done > "$out"
echo "exit ${PIPESTATUS[0]}" >> "$out"
