#!/usr/bin/env bash
# The paper's offline protocol (sections 4.1-4.2) on the embedded target with the shipped reference drafters:
# temperature 1.0, fixed 7-token proposals, no scheduler, all three domains, fixed seeds, 256 new tokens.
#
#   scripts/offline_protocol.sh OUT STAGE...     STAGE: a | b | dspark-1l | markov-off | r1   (default: all)
#   LIMIT=32 (prompts per dataset) RUNS=runs/smollm2 (training runs, for the dspark-1l ablation)
#
# a: none, dspark, dflash; b: none, eagle3, mtp -- each stage one run at concurrency 8, so each drafter's speedup
# over `none` is measured side by side in its own run (tau does not depend on the stage or the batch).
# dspark-1l: DSpark with one backbone layer (Figure 3); markov-off: the shipped DSpark without its Markov head.
# r1: every drafter at concurrency 1 on 3 prompts per dataset, 2 repeats: the single-request speedups.
# A stage whose summary.json exists is skipped, so re-running resumes stage by stage.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/offline_protocol.sh OUT [STAGE...]}
shift
STAGES=("$@")
[ ${#STAGES[@]} -gt 0 ] || STAGES=(a b dspark-1l markov-off r1)
RUNS=${RUNS:-runs/smollm2}
LIMIT=${LIMIT:-32}
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=1
P=(--suite all --limit "$LIMIT" --max-new-tokens 256 --temperature 1.0 --block-size 7 --scheduler fixed --concurrency 8)
mkdir -p "$OUT"
run() {  # run NAME ARGS...
  local name=$1; shift
  [ -f "$OUT/$name/summary.json" ] || $BIN/dspark-bench run "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
}
for stage in "${STAGES[@]}"; do
  case $stage in
    a) run a "${P[@]}" --drafter none,dspark,dflash ;;
    b) run b "${P[@]}" --drafter none,eagle3,mtp ;;
    dspark-1l) run dspark-1l "${P[@]}" --drafter dspark --drafter-opt "dspark.checkpoint=$RUNS/dspark-1l/final" ;;
    markov-off) run markov-off "${P[@]}" --drafter dspark --drafter-opt dspark.markov=false ;;
    r1) run r1 --suite all --limit 3 --max-new-tokens 128 --temperature 1.0 --block-size 7 --concurrency 1 \
          --repeats 2 --drafter none,dspark,dflash,eagle3,mtp ;;
    *) echo "unknown stage $stage (a, b, dspark-1l, markov-off, r1)"; exit 2 ;;
  esac
done
echo "done: $OUT (${STAGES[*]})"
