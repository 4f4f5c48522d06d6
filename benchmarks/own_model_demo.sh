#!/usr/bin/env bash
# The demo's goals through the node on a GGUF file of your own, with the node's peak RSS.
#   benchmarks/own_model_demo.sh FILE.gguf [OUT.md]
# Runs `timebill demo` with engine.model_path = FILE (config/llm.yaml otherwise), polls the
# server process's peak resident set (VmHWM, /proc) every 0.2 s, and writes the demo's table,
# the peak RSS and the file's size to OUT.md (default: stdout only).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
model="$(realpath "$1")"
out="${2:-}"
# shellcheck disable=SC1091
source scripts/env.sh
params="$(mktemp --suffix=.yaml)"
log="$(mktemp)"
trap 'rm -f "$params" "$log"' EXIT
sed "s|^      model_path: '' |      model_path: $model |" config/llm.yaml > "$params"
grep -q "model_path: $model" "$params" || { echo "could not set model_path" >&2; exit 1; }
timebill demo --params "$params" --no-build-predictors > "$log" 2>&1 &
demo=$!
peak_kb=0
while kill -0 "$demo" 2> /dev/null; do
  for pid in $(pgrep -f 'timebill_ros.cli serve' || true); do
    kb=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status" 2> /dev/null || echo 0)
    [[ -n "$kb" && "$kb" -gt "$peak_kb" ]] && peak_kb=$kb
  done
  sleep 0.2
done
wait "$demo"
size=$(stat -c %s "$model")
{
  echo "# The demo through the node on $(basename "$model")"
  echo
  echo "Command: \`benchmarks/own_model_demo.sh $(basename "$model")\`; host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $(date -u +%Y-%m-%d)."
  echo
  echo '```'
  grep -v '^starting the timebill server' "$log"
  echo '```'
  echo
  awk -v p="$peak_kb" -v s="$size" 'BEGIN {printf "Node peak RSS: %.0f MB; file: %.0f MB; bound (1 GB + 2 x file): %.0f MB.\n", p / 1024, s / 2^20, 1024 + 2 * s / 2^20}'
} | if [[ -n "$out" ]]; then tee "$out"; else cat; fi
