#!/usr/bin/env bash
# The paper's serving claims on this machine, through our engine under open-loop load: `none`, DSpark verifying
# its whole block (fixed) and confidence-scheduled DSpark (hardware-aware), each request rate on one seeded
# Poisson arrival schedule shared by the three; then the report (serving section: per-user vs system tok/s,
# p90 TPOT vs system tok/s, goodput vs rate, and each method against none). Sized for about 20 minutes on the
# 2-core development CPU (fp32, one torch thread): 16 prompts x 64 new tokens per cell, 6 rates x 3 cells.
#
#   recipes/serving_sweep.sh OUT
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: recipes/serving_sweep.sh OUT}
BIN=${BIN:-.venv/bin}
PROFILE=${PROFILE:-baselines/profiles/smollm2-135m-cpu2.json}  # hardware-aware's cost model (dspark-bench profile)
RATES=${RATES:-0.25,0.5,1,2,4,8}
export OMP_NUM_THREADS=1
mkdir -p "$OUT"
uptime > "$OUT/load-before.txt"
[ -f "$OUT/sweep/sweep.json" ] || $BIN/dspark-bench sweep --drafter dspark --scheduler fixed,hardware-aware \
  --baseline none --request-rate "$RATES" --max-concurrency 16 --slo tpot=150 --limit 4 --max-new-tokens 64 \
  --profile "$PROFILE" --threads 1 --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
uptime > "$OUT/load-after.txt"
$BIN/dspark-bench report "$OUT/sweep" -o "$OUT/report" > "$OUT/report.log" 2>&1
echo "done: $OUT/sweep/sweep.json, $OUT/report/report.md"
