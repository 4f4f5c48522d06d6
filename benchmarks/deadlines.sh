#!/usr/bin/env bash
# Issue 9's measurements, one after another on an otherwise idle machine (2 h or more on the
# 2-core development VM); README section "Deadlines you can rely on" shows the results.
#   bash benchmarks/deadlines.sh [STAGE ...]     stages, in this order by default:
#     setup   the tree before issue 9 (BEFORE_REV) checked out and built beside this one (same
#             venv); a fresh few-shot calibration: results/deadlines/calibration.yaml, also put
#             in the cache so every stage below uses it
#     cost    what the per-layer stop checks cost a decoding step
#     kill    kill / cancel latency: the same 340 goals through the core of both trees
#     after   only the current tree's kill / cancel run (the "before" run stays as it is)
#     drift   the WCET drift run and admission through the node (waits until the calibration
#             is >= 20 min old); --goal-set second: goals the estimator was not chosen on
#     bench   `timebill bench` with vanilla, timebill (self-correcting model, admission,
#             expected fallback), timebill-clamp (the same with the paper's alpha_max clamp)
#             and timebill-fixed (the calibration as is, no admission, clamp: decisions as
#             before this issue), all servers up at once and the job streams interleaved
#     bench-before  the same benchmark of the tree before this issue and of this one, one
#             after the other (sequential: confounded by the machine's drift; kept for record)
#     ab      same goals through the core of both trees, alternating processes (ab_speed.py)
#     admission  infeasible goals through ROS (admission_latency.py)
#     report  re-make the kill / cancel tables from the raw JSON
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
OUT=benchmarks/results/deadlines
BEFORE_REV="${BEFORE_REV:-f0219d6}"
BEFORE="${BEFORE_TREE:-/tmp/timebill_before}"
# shellcheck disable=SC1091
source scripts/env.sh
mkdir -p "$OUT" log
stages=("$@")
[[ ${#stages[@]} -gt 0 ]] || stages=(setup cost kill drift ab admission bench)

before_tree() {
  if [[ ! -d "$BEFORE" ]]; then
    git worktree add -f "$BEFORE" "$BEFORE_REV"
  fi
  ln -sfn "$ROOT/.venv" "$BEFORE/.venv"
  (cd "$BEFORE" && env -u PYTHONPATH -u AMENT_PREFIX_PATH -u CMAKE_PREFIX_PATH \
    bash -c 'scripts/build.sh' > "$ROOT/log/deadlines_build_before.log")
}

for stage in "${stages[@]}"; do
  echo "== stage $stage"
  case "$stage" in
    setup)
      scripts/build.sh > log/deadlines_build.log
      before_tree
      timebill profile --few-shot --out "$OUT/calibration.yaml"
      cache="$(python -c 'from timebill_ros.config import EngineConfig
from timebill_ros.timing.profiler import key_fields
from timebill_ros.timing.model import calibration_key, default_calibration_path
print(default_calibration_path(calibration_key(*key_fields(EngineConfig()))))')"
      mkdir -p "$(dirname "$cache")"
      cp "$OUT/calibration.yaml" "$cache" ;;
    cost)
      timebill study stop_check_cost | tee "$OUT/stop_check_cost.txt" ;;
    kill)
      timebill study kill_latency plan --out "$OUT"
      env PYTHONPATH="$BEFORE" python timebill_ros/bench/studies/kill_latency.py run --out "$OUT" --label before
      timebill study kill_latency run --out "$OUT" --label after
      timebill study kill_latency report --out "$OUT" ;;
    after)
      timebill study kill_latency run --out "$OUT" --label after
      timebill study kill_latency report --out "$OUT" ;;
    drift)
      timebill study wcet_drift --calibration "$OUT/calibration.yaml" --out "$OUT" \
        --goal-set second --tag wcet_drift ;;
    bench)
      timebill bench --methods timebill,timebill-clamp,timebill-fixed \
        --fractions 0.9,1.0,1.1 \
        --out "$OUT/bench_interleaved" ;;
    ab)
      before_tree
      timebill study ab_speed --tree before="$BEFORE" --tree after=. --rounds 2 ;;
    admission)
      timebill study admission_latency --out "$OUT" ;;
    bench-before)
      before_tree
      env -i HOME="$HOME" PATH=/usr/local/bin:/usr/bin:/bin bash -c \
        "source '$BEFORE/scripts/env.sh' && cd '$BEFORE' && \
         timebill bench --methods timebill --out '$ROOT/$OUT/bench_seq_before'"
      timebill bench --methods timebill --out "$OUT/bench_seq_after" ;;
    report)
      timebill study kill_latency report --out "$OUT" ;;
    *)
      echo "unknown stage $stage" >&2
      exit 2 ;;
  esac
done
