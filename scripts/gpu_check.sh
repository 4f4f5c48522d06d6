#!/usr/bin/env bash
# The CUDA path in one command (`make gpu-check`, or on a machine whose python has CUDA torch:
# scripts/gpu_check.sh OUT_DIR). Each part runs in its own process under a time limit, so one
# that fails or hangs leaves the others' figures; the report is made of what finished.
# Parts: the CPU kernels' build, the refused formats, stop latency and chunked prefill
# (benchmarks/gpu_check.py), the engine formats side by side (timebill enginebench --device
# cuda), the demo's goals and the decode probe (the bare engine's steps against the service's).
# A second argument `cpu` makes it a dry run on the CPU at small sizes (CI runs it so).
set -u
out="${1:-log/gpu_check}"
device="${2:-cuda}"
py="${PYTHON:-$(command -v python || command -v python3)}"  # Ubuntu has only python3
if [[ "$device" == cpu ]]; then  # limits (s): two cores, a first start calibrates
  stops=(--device cpu --lines 20)
  bench=(--device cpu --quick --rounds 1 --steps 4)
  limits=(120 60 120 300 480)
else  # on one GPU the parts stay under 10 minutes (a fresh machine builds the kernels: 46 s on an H200)
  stops=(--device "$device")
  bench=(--device "$device")
  limits=(120 45 90 120 240)
fi
mkdir -p "$out"
rm -f "$out/gpu_check.jsonl"
status=0
rm -f "$out/parts.tsv"
run() {  # run LIMIT_S PART...; each part's exit status and seconds go to parts.tsv (the report)
  local limit="$1" rc=0 begin=$SECONDS
  shift
  echo "== $* (at most ${limit} s)"
  timeout "$limit" "$@" || { rc=$?; echo "== FAILED ($rc): $*"; status=1; }
  printf '%s\t%s\t%s\t%s\n' "$*" "$rc" "$((SECONDS - begin))" "$limit" >> "$out/parts.tsv"
}
# The CPU kernels first (the preset's offload executor decodes on them): built once, cached.
run "${limits[0]}" "$py" -m timebill_ros.engine.kernels
run "${limits[1]}" "$py" benchmarks/gpu_check.py refusals --device "$device" --out "$out"
run "${limits[2]}" "$py" benchmarks/gpu_check.py stops "${stops[@]}" --out "$out"
run "${limits[3]}" "$py" -m timebill_ros.cli enginebench "${bench[@]}" --out "$out/engine"
run "${limits[4]}" "$py" benchmarks/gpu_check.py demo --device "$device" --out "$out"
"$py" benchmarks/gpu_check.py report --out "$out" || status=1
exit "$status"
