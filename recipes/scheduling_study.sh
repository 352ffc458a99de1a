#!/usr/bin/env bash
# Confidence-scheduled verification under load, with the shipped DSpark on this machine: engine profile, STS
# calibration on held-out generated prompts, the concurrency x scheduler sweep with the paper's baselines, the
# threshold sweep (Figure 5), and the simulation validated on the sweep. Every stage is skipped when its output
# exists.
#
#   recipes/scheduling_study.sh OUT [OFFLINE_RUN]    (OFFLINE_RUN: fixed-length records to replay in simulate)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: recipes/scheduling_study.sh OUT [OFFLINE_RUN]}
OFFLINE=${2:-}
BIN=${BIN:-.venv/bin}
SHIPPED=dspark_bench/drafters/shipped/smollm2-135m/dspark
PROFILE=${PROFILE:-baselines/profiles/smollm2-135m-cpu2.json}
export OMP_NUM_THREADS=1
mkdir -p "$OUT" "$(dirname "$PROFILE")"
[ -f "$PROFILE" ] || $BIN/dspark-bench profile --threads 1 --contexts 128,512 --max-batch-tokens 128 --repeats 5 \
  --out "$PROFILE" > "$OUT/profile.log" 2>&1
# STS on 48 prompts from the training-prompt generator under seed 7 (neither training nor evaluation text).
if [ ! -f "$SHIPPED/calibration.json" ]; then
  $BIN/dspark-bench calibrate --drafter dspark --source generated --heldout 48 --seed 7 --concurrency 16 \
    --max-new-tokens 128 --threads 1 --out "$OUT/calibration" > "$OUT/calibration.log" 2>&1
  cp "$OUT/calibration/calibration.json" "$SHIPPED/calibration.json"
fi
# One sweep per concurrency: R = 16 on 4 prompts per dataset and R = 1 on 2, two passes in ABBA order; with
# FULL=1 also R = 4 and 8 on 2 prompts per dataset, one pass.
sweep() {  # sweep R LIMIT [REPEATS]
  [ -f "$OUT/sweep-r$1/sweep.json" ] || $BIN/dspark-bench sweep --drafter dspark --concurrency "$1" \
    --scheduler fixed,threshold,hardware-aware,async --fixed-lengths 1,2,3 --baseline none,mtp \
    --limit "$2" --max-new-tokens 64 --repeats "${3:-2}" --profile "$PROFILE" --threads 1 --out "$OUT/sweep-r$1" \
    > "$OUT/sweep-r$1.log" 2>&1
}
sweep 16 4
sweep 1 2
if [ -n "$OFFLINE" ] && [ ! -f "$OUT/simulate.json" ]; then
  $BIN/dspark-bench simulate --records "$OFFLINE" --drafter dspark --profile "$PROFILE" --sweep "$OUT/sweep-r16" \
    --out "$OUT/simulate.json" > "$OUT/simulate.log" 2>&1
fi
[ "${FULL:-0}" = 1 ] || { echo "done: $OUT (FULL=1 adds R = 4, 8 and the threshold sweep)"; exit 0; }
sweep 4 2 1
sweep 8 2 1
[ -f "$OUT/theta/sweep.json" ] || $BIN/dspark-bench sweep --drafter dspark --concurrency 4 --threshold-sweep \
  --baseline none --limit 4 --max-new-tokens 64 --profile "$PROFILE" --threads 1 --out "$OUT/theta" > "$OUT/theta.log" 2>&1
echo "done: $OUT"
