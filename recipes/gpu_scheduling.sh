#!/usr/bin/env bash
# Confidence scheduling under load: the cost-model profile (verify grid, DSpark's propose and
# the engine overhead per R), then one sweep of none, DSpark fixed (7), fixed 1-3 and hardware-aware (padded,
# drafter skip on) with the embedded target, and the simulation validated on it. Writes OUT/profile.json,
# OUT/sweep/ (sweep.json and every cell's records), OUT/simulate.json and a log per stage.
#
#   recipes/gpu_scheduling.sh OUT          on a CUDA machine: concurrency 1-256, bf16, within 10 minutes
#   recipes/gpu_scheduling.sh OUT smoke    anywhere (CPU): the same commands at tiny settings (what the test runs)
#
# BIN (default .venv/bin) is where dspark-bench lives. The goal: hardware-aware system throughput
# >= 0.97 x max(none, best fixed length) at every concurrency.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: recipes/gpu_scheduling.sh OUT [smoke]}
MODE=${2:-full}
BIN=${BIN:-.venv/bin}
mkdir -p "$OUT"
case "$MODE" in
  full)
    $BIN/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: use smoke')"
    PROFILE=(--dtype bf16 --rows 1,2,4,8,16,32,64,128,256 --contexts 128,512 --repeats 5)
    COMMON=(--dtype bf16 --max-new-tokens 64)
    # two sweeps: 8 prompts per dataset at R = 1-16 (a c=1 cell of 256 prompts alone would take minutes), 64 at
    # R = 64 and 256 (enough to hold the batch); each sweep's cells share its prompts and run interleaved
    LOW=(--concurrency 1,4,16 --limit 8) HIGH=(--concurrency 64,256 --limit 64)
    LIMIT=580 ;;
  smoke)
    export OMP_NUM_THREADS=1
    PROFILE=(--dtype fp32 --rows 1,2 --contexts 16 --repeats 1 --max-batch-tokens 8 --width 3 --block-size 2
             --threads 1)
    COMMON=(--dtype fp32 --suite code --max-new-tokens 4 --block-size 2 --threads 1)
    LOW=(--concurrency 1 --limit 2) HIGH=(--concurrency 2 --limit 2)
    LIMIT=300 ;;
  *) echo "unknown mode $MODE: use full or smoke" >&2; exit 2 ;;
esac
start=$(date +%s)
left() { echo $((LIMIT - ($(date +%s) - start))); }
timeout "$(left)" "$BIN/dspark-bench" profile --target smollm2-135m --drafter dspark "${PROFILE[@]}" \
  --out "$OUT/profile.json" > "$OUT/profile.log" 2>&1
sweep() {  # sweep NAME ARGS...
  local name=$1; shift
  timeout "$(left)" "$BIN/dspark-bench" sweep --target smollm2-135m --drafter dspark \
    --scheduler "fixed,hardware-aware[layout=padded]" --fixed-lengths 1,2,3 --baseline none "${COMMON[@]}" "$@" \
    --profile "$OUT/profile.json" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
}
sweep sweep-low "${LOW[@]}"
sweep sweep-high "${HIGH[@]}"
# SIMULATED beyond the measured levels, from the full-verification rounds at the lowest concurrency
first=$(ls -d "$OUT"/sweep-low/cells/dspark__fixed__c* | head -1)
timeout "$(left)" "$BIN/dspark-bench" simulate --records "$first" --drafter dspark --profile "$OUT/profile.json" \
  --sweep "$OUT/sweep-low,$OUT/sweep-high" --scheduler "fixed,hardware-aware[layout=padded]" \
  --concurrency 1,2,4,8,16,32,64,128,256,512 --out "$OUT/simulate.json" > "$OUT/simulate.log" 2>&1
echo "done: $OUT in $(( $(date +%s) - start )) s"
