#!/usr/bin/env bash
# Issue 9's measurements, one after another on an otherwise idle machine (about 100 min on the
# 2-core development VM): README section "Deadlines you can rely on" shows the results.
#   bash benchmarks/deadlines.sh          # everything below
#   bash benchmarks/deadlines.sh report   # only re-make the kill/cancel tables from the raw JSON
# 1. the tree before issue 9 (BEFORE_REV), checked out and built beside this one (same venv);
# 2. a fresh few-shot calibration: results/deadlines/calibration.yaml, also put in the cache,
#    so both kill-latency runs and the drift run use it;
# 3. the cost of the per-layer stop checks, then kill / cancel latency: the same 340 goals
#    through the core of both trees (~35 min);
# 4. the WCET drift run and admission through the node (starts >= 20 min after step 2);
# 5. `timebill bench --methods timebill` (vanilla runs too) with each tree's own client/server.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
OUT=benchmarks/results/deadlines
BEFORE_REV="${BEFORE_REV:-f0219d6}"
BEFORE="${BEFORE_TREE:-/tmp/timebill_before}"
# shellcheck disable=SC1091
source scripts/env.sh
if [[ "${1:-}" == report ]]; then
  python benchmarks/kill_latency.py report --out "$OUT"
  exit 0
fi
mkdir -p "$OUT" log
scripts/build.sh > log/deadlines_build.log
if [[ ! -d "$BEFORE" ]]; then
  git worktree add -f "$BEFORE" "$BEFORE_REV"
fi
ln -sfn "$ROOT/.venv" "$BEFORE/.venv"
(cd "$BEFORE" && env -u PYTHONPATH -u AMENT_PREFIX_PATH -u CMAKE_PREFIX_PATH \
  bash -c 'scripts/build.sh' > "$ROOT/log/deadlines_build_before.log")

timebill profile --few-shot --out "$OUT/calibration.yaml"
cache="$(python -c 'from timebill_ros.config import EngineConfig
from timebill_ros.timing.profiler import key_fields
from timebill_ros.timing.model import calibration_key, default_calibration_path
print(default_calibration_path(calibration_key(*key_fields(EngineConfig()))))')"
mkdir -p "$(dirname "$cache")"
cp "$OUT/calibration.yaml" "$cache"

python benchmarks/stop_check_cost.py | tee "$OUT/stop_check_cost.txt"
python benchmarks/kill_latency.py plan --out "$OUT"
env PYTHONPATH="$BEFORE" python benchmarks/kill_latency.py run --out "$OUT" --label before
python benchmarks/kill_latency.py run --out "$OUT" --label after
python benchmarks/kill_latency.py report --out "$OUT"

python benchmarks/wcet_drift.py --calibration "$OUT/calibration.yaml" --out "$OUT"

env -i HOME="$HOME" PATH=/usr/local/bin:/usr/bin:/bin bash -c \
  "source '$BEFORE/scripts/env.sh' && cd '$BEFORE' && \
   timebill bench --methods timebill --out '$ROOT/$OUT/bench_before'"
timebill bench --methods timebill --out "$OUT/bench_after"
