#!/usr/bin/env bash
# The paper's offline protocol (sections 4.1-4.2) on the embedded target with the shipped reference drafters:
# temperature 1.0, fixed 7-token proposals, no scheduler, all three domains, up to 100 prompts per dataset
# (GSM8K 100, AIME25 30, HumanEval 100, chat 96), 256 new tokens, the suites' fixed seeds.
#
#   scripts/offline_protocol.sh OUT [RUNS]      (RUNS: training run folders for the ablations, default runs/smollm2)
#
# Two lanes of one torch thread each (this machine has 2 cores): tau does not depend on the lane or the batch,
# and each lane measures its drafters' speedup over `none` side by side (concurrency 16). A third, short run at
# concurrency 1 measures the single-request speedups the paper reports.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/offline_protocol.sh OUT [RUNS]}
RUNS=${2:-runs/smollm2}
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=1
P=(--suite all --limit 100 --max-new-tokens 256 --temperature 1.0 --block-size 7 --scheduler fixed --concurrency 16)
mkdir -p "$OUT"
run() {  # run NAME ARGS...: skip a lane whose summary exists (re-run resumes lane by lane)
  local name=$1; shift
  [ -f "$OUT/$name/summary.json" ] || $BIN/dspark-bench run "${P[@]}" --out "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
}
lane_a() {
  run a --drafter none,dspark,mtp
  # Figure 3: DSpark with one backbone layer (vs the 2-layer DFlash of lane b).
  [ -d "$RUNS/dspark-1l/final" ] && run dspark-1l --drafter dspark --drafter-opt "dspark.checkpoint=$RUNS/dspark-1l/final"
  return 0
}
lane_b() {
  run b --drafter none,dflash,eagle3
  run markov-off --drafter dspark --drafter-opt dspark.markov=false  # the Markov head's share of tau
}
lane_a & A=$!
lane_b & B=$!
wait $A; wait $B
# Single-request wall clock, every drafter side by side in one run, alone on the machine.
[ -f "$OUT/r1/summary.json" ] || $BIN/dspark-bench run --suite all --limit 3 --max-new-tokens 128 --temperature 1.0 \
  --block-size 7 --concurrency 1 --repeats 2 --drafter none,dspark,dflash,eagle3,mtp --out "$OUT/r1" > "$OUT/r1.log" 2>&1
echo "done: $OUT"
