#!/usr/bin/env bash
# Regenerates benchmarks/results/latency/ (issue 4: SimFLi few-shot profiling vs TimeBill's
# full-grid fit). Run from the repo root after `make build`, on an otherwise idle machine:
#   bash benchmarks/latency.sh            # everything, about 30 min on a 2-core CPU VM
#   bash benchmarks/latency.sh report     # only re-score the committed grid and calibrations
set -euo pipefail
source scripts/env.sh
OUT=benchmarks/results/latency
CAL=$OUT/calibrations
mkdir -p "$CAL"
if [[ "${1:-all}" == all ]]; then
  timebill latency measure --out "$OUT"                   # 13 n_in x 3 repeats x 192 tokens
  timebill profile --out "$CAL/full_grid.yaml"            # TimeBill's full grid (24 lengths)
  timebill profile --quick --out "$CAL/startup_grid.yaml" # the start-up grid
  for i in 1 2 3; do                                      # five probes, three times
    timebill profile --few-shot --out "$CAL/few_shot_$i.yaml"
  done
fi
timebill latency report --out "$OUT" \
  --calibration "profile (full grid)=$CAL/full_grid.yaml" \
  --calibration "profile --quick=$CAL/startup_grid.yaml" \
  --calibration "profile --few-shot #1=$CAL/few_shot_1.yaml" \
  --calibration "profile --few-shot #2=$CAL/few_shot_2.yaml" \
  --calibration "profile --few-shot #3=$CAL/few_shot_3.yaml"
if [[ "${1:-all}" == all ]]; then
  # A fresh few-shot calibration right before the goals, next to the older ones: the VM's
  # speed drifts by 10-30 % over minutes.
  timebill profile --few-shot --out "$CAL/few_shot_before_wcet.yaml"
  timebill latency wcet --out "$OUT" --prompts 32 --n-max 128 \
    --calibration "full grid=$CAL/full_grid.yaml" \
    --calibration "few-shot #1=$CAL/few_shot_1.yaml" \
    --calibration "start-up grid=$CAL/startup_grid.yaml" \
    --calibration "few-shot just before=$CAL/few_shot_before_wcet.yaml"
fi
