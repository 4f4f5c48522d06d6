#!/usr/bin/env bash
# The CUDA path in one command (`make gpu-check`, or on a machine whose python has CUDA torch:
# scripts/gpu_check.sh OUT_DIR). Each part runs in its own process under a time limit, so one
# that fails or hangs leaves the others' figures; the report is made of what finished.
# Parts: the refused formats, stop latency and chunked prefill (benchmarks/gpu_check.py), the
# engine formats side by side (timebill enginebench --device cuda), the demo's goals.
set -u
out="${1:-log/gpu_check}"
py="${PYTHON:-python}"
mkdir -p "$out"
rm -f "$out/gpu_check.jsonl"
status=0
run() {  # run LIMIT_S PART...
  local limit="$1"
  shift
  echo "== $* (at most ${limit} s)"
  timeout "$limit" "$@" || { echo "== FAILED ($?): $*"; status=1; }
}
run 60 "$py" benchmarks/gpu_check.py refusals --out "$out"
run 120 "$py" benchmarks/gpu_check.py stops --out "$out"
run 150 "$py" -m timebill_ros.cli \
  enginebench --device cuda --out "$out/engine"
run 180 "$py" benchmarks/gpu_check.py demo --out "$out"
"$py" benchmarks/gpu_check.py report --out "$out" || status=1
exit "$status"
