#!/usr/bin/env bash
# The paper's offline protocol (sections 4.1-4.2) on the embedded target with the shipped drafters: temperature 1.0,
# fixed 7-token proposals, no scheduler, all three domains, fixed seeds, 256 new tokens.
#
#   recipes/offline_protocol.sh OUT STAGE...     STAGE: a | b | dspark-1l | markov-off | r1   (default: all)
#
# a: none, dspark, dflash; b: none, eagle3, mtp -- each stage one run at CONCURRENCY, so each drafter's speedup
# over `none` is measured side by side in its own run (tau does not depend on the stage or the batch).
# dspark-1l: DSpark with one backbone layer (Figure 3); markov-off: the shipped DSpark without its Markov head.
# r1: every drafter at concurrency 1 on R1_LIMIT prompts per dataset, R1_REPEATS interleaved repeats: the
# single-request wall clock (speedup over `none`, drafting's share of a vanilla step). Only r1's times need a quiet machine;
# stages a and b may run side by side (LANES=2 runs them at once, one torch thread each) when only tau is wanted.
# A stage whose summary.json exists is skipped and one cut short is completed (`run --resume`), so re-running
# resumes stage by stage.
#
# Settings (environment): LIMIT=100 (prompts per dataset of a-markov-off: GSM8K 100, AIME25 all 30, HumanEval 100,
# chat 100 of 128, so every domain has at least 100), CONCURRENCY=8, MAX_NEW=256, DTYPE=fp32 (on a CPU without
# AVX-512-BF16 bf16 is many times slower; the drafters of data/smollm2/train-6k were trained on fp32 features),
# R1_LIMIT=4, R1_REPEATS=2, R1_THREADS=2 (r1 has the quiet machine to itself; the other stages take one torch thread
# each), LANES=1, RUNS=runs/smollm2 (training runs, for the dspark-1l ablation), BIN=.venv/bin.
# DRAFTERS: a folder with one checkpoint per method (DRAFTERS/dspark, .../dflash, .../eagle3, .../mtp), e.g. candidate
# drafters not yet shipped; every stage but dspark-1l then loads those instead of the shipped ones (default: shipped).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: recipes/offline_protocol.sh OUT [STAGE...]}
shift
STAGES=("$@")
KNOWN=(a b dspark-1l markov-off r1)
[ ${#STAGES[@]} -gt 0 ] || STAGES=("${KNOWN[@]}")
RUNS=${RUNS:-runs/smollm2}
LIMIT=${LIMIT:-100}
MAX_NEW=${MAX_NEW:-256}
LANES=${LANES:-1}
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=1
C=(--temperature 1.0 --block-size 7 --scheduler fixed --max-new-tokens "$MAX_NEW" --dtype "${DTYPE:-fp32}")
if [ -n "${DRAFTERS:-}" ]; then
  for m in dspark dflash eagle3 mtp; do
    [ -f "$DRAFTERS/$m/model.safetensors" ] || { echo "DRAFTERS=$DRAFTERS holds no $m checkpoint ($DRAFTERS/$m/model.safetensors)" >&2; exit 2; }
  done
fi
ck() {  # ck METHOD...: the --drafter-opt of each method's DRAFTERS checkpoint (none without DRAFTERS)
  local m
  [ -n "${DRAFTERS:-}" ] || return 0
  for m in "$@"; do printf -- '--drafter-opt\n%s.checkpoint=%s\n' "$m" "$DRAFTERS/$m"; done
}
P=(--suite all --limit "$LIMIT" --concurrency "${CONCURRENCY:-8}" "${C[@]}")
for s in "${STAGES[@]}"; do  # bad input fails before any work
  [[ " ${KNOWN[*]} " == *" $s "* ]] || { echo "unknown stage $s (${KNOWN[*]})"; exit 2; }
done
mkdir -p "$OUT"
run() {  # run NAME ARGS...: a stage's run; one that stopped part way (no summary.json) is completed by --resume
  local name=$1; shift
  if [ -f "$OUT/$name/summary.json" ]; then return 0; fi
  if [ -f "$OUT/$name/manifest.json" ]; then
    $BIN/dspark-bench run --resume "$OUT/$name" >> "$OUT/$name.log" 2>&1
  else
    $BIN/dspark-bench run "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  fi
}
stage() {
  local x
  case $1 in  # x: the stage's --drafter-opt checkpoints (ck), one array item per line
    a) mapfile -t x < <(ck dspark dflash); run a "${P[@]}" --drafter none,dspark,dflash "${x[@]}" ;;
    b) mapfile -t x < <(ck eagle3 mtp); run b "${P[@]}" --drafter none,eagle3,mtp "${x[@]}" ;;
    dspark-1l) run dspark-1l "${P[@]}" --drafter dspark --drafter-opt "dspark.checkpoint=$RUNS/dspark-1l/final" ;;
    markov-off) mapfile -t x < <(ck dspark); run markov-off "${P[@]}" --drafter dspark "${x[@]}" --drafter-opt dspark.markov=false ;;
    r1) mapfile -t x < <(ck dspark dflash eagle3 mtp)
        OMP_NUM_THREADS=${R1_THREADS:-2} run r1 --suite all --limit "${R1_LIMIT:-4}" --concurrency 1 --repeats "${R1_REPEATS:-2}" "${C[@]}" \
          --drafter none,dspark,dflash,eagle3,mtp "${x[@]}" ;;
  esac
}
pids=()
for s in "${STAGES[@]}"; do
  stage "$s" & pids+=($!)
  if [ ${#pids[@]} -ge "$LANES" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p"; done
echo "done: $OUT (${STAGES[*]})"
