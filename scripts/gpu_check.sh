#!/usr/bin/env bash
# The CUDA path in one command (`make gpu-check`, or on a machine whose python has CUDA torch:
# scripts/gpu_check.sh OUT_DIR). Each part runs in its own process under a time limit, so one
# that fails or hangs leaves the others' figures; the report is made of what finished.
# Parts: the refused formats; the GGUF files of GPU_MODELS (default: the embedded model) on the
# device, bare and through the service (timebill_ros/bench/studies/gpu_gguf.py: agreement with the committed CPU
# reference, decode at 100 / 1000 / 3000 KV, prefill, held-out goals under Kill); stop latency
# and chunked prefill; the CPU kernels' build; the demo's goals with the preset's CPU offload
# executor and the decode probe (timebill_ros/bench/studies/gpu_check.py).
# A second argument `cpu` makes it a dry run on the CPU at small sizes (CI runs it so).
set -u
out="${1:-log/gpu_check}"
device="${2:-cuda}"
py="${PYTHON:-$(command -v python || command -v python3)}"  # Ubuntu has only python3
read -r -a models <<< "${GPU_MODELS:-embedded}"  # GPU_MODELS: .gguf paths, or 'embedded'
if [[ "$device" == cpu ]]; then  # limits (s): two cores, a first start calibrates
  stops=(--device cpu --lines 20)
  gguf=(--device cpu --quick --dtypes float32)
  serve=(--device cpu --goals 4 --params config/llm.yaml --dtypes float32)
  # bare: 8 agreement answers and the decode rows on the dense CPU path ran past 120 s on an
  # AVX2-only 2-core VM (2026-11-28); the dry run checks that the parts work, not their speed.
  limits=(30 360 420 120 120 480)
else  # on one GPU the parts stay under 10 minutes (the kernels' first build: 46 s on an H200)
  stops=(--device "$device")
  gguf=(--device "$device")
  serve=(--device "$device")
  limits=(30 240 240 90 120 300)
fi
# GPU_PARTS: run only these parts (names below), appending to OUT_DIR's rows; unset: every
# part, OUT_DIR's rows started afresh. (A lent GPU gets the model files over several calls:
# the parts that need only the files already there run in the calls that bring the others.)
parts="${GPU_PARTS:-refusals bare serve stops kernels demo report}"
mkdir -p "$out"
if [[ -z "${GPU_PARTS:-}" ]]; then
  rm -f "$out/gpu_check.jsonl" "$out/gpu_gguf.jsonl" "$out/parts.tsv"
fi
status=0
run() {  # run NAME LIMIT_S PART...; each part's exit status and seconds go to parts.tsv
  local name="$1" limit="$2" rc=0 begin=$SECONDS
  shift 2
  [[ " $parts " == *" $name "* ]] || return 0
  echo "== $* (at most ${limit} s)"
  timeout "$limit" "$@" || { rc=$?; echo "== FAILED ($rc): $*"; status=1; }
  printf '%s\t%s\t%s\t%s\n' "$*" "$rc" "$((SECONDS - begin))" "$limit" >> "$out/parts.tsv"
}
run refusals "${limits[0]}" "$py" -m timebill_ros.bench.studies.gpu_check refusals --device "$device" --out "$out"
# The GGUF files on the device (the dense decoder, CUDA-graph steps), bare and through the service.
run bare "${limits[1]}" "$py" -m timebill_ros.bench.studies.gpu_gguf bare --models "${models[@]}" "${gguf[@]}" \
  --out "$out"
run serve "${limits[2]}" "$py" -m timebill_ros.bench.studies.gpu_gguf serve --models "${models[@]}" "${serve[@]}" \
  --out "$out"
run stops "${limits[3]}" "$py" -m timebill_ros.bench.studies.gpu_check stops "${stops[@]}" --out "$out"
# The CPU kernels (the preset's offload executor decodes on them): built once, cached.
run kernels "${limits[4]}" "$py" -m timebill_ros.engine.kernels
run demo "${limits[5]}" "$py" -m timebill_ros.bench.studies.gpu_check demo --device "$device" --offload --out "$out"
if [[ " $parts " == *" report "* ]]; then
  "$py" -m timebill_ros.bench.studies.gpu_gguf report --out "$out" || status=1
  "$py" -m timebill_ros.bench.studies.gpu_check report --out "$out" || status=1
fi
exit "$status"
