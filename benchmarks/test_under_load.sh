#!/bin/bash
# `make test` on a fresh clone of main while two `yes > /dev/null` (nice 0) keep both cores of
# a 2-core machine busy (issue 58: the tests decide on inputs they control, not on its speed).
#   bash benchmarks/test_under_load.sh LOG
# The last line of LOG: "rc=<make's exit status> wall=<seconds> s".
set -u
log="${1:?usage: test_under_load.sh LOG}"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rm -rf /tmp/load_clone && git clone -q -b main "$repo" /tmp/load_clone && cd /tmp/load_clone || exit 1
yes > /dev/null & y1=$!
yes > /dev/null & y2=$!
start=$(date +%s)
CI=true make test > "$log" 2>&1
rc=$?
kill $y1 $y2
echo "rc=$rc wall=$(( $(date +%s) - start )) s" >> "$log"
