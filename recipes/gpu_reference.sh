#!/usr/bin/env bash
# The shipped drafters' training budget for smollm2-135m (baselines/drafters/RECIPE.md section 5 and "Fine-tunes on
# T = 1.0 data"), replayed on one GPU in one go. The four methods train at the same time, each in two runs on the
# committed data (nothing is generated):
#   1. from fresh weights on data/smollm2/train-6k (6,144 prompts answered at T = 0.7), STEPS1 steps at LR1;
#   2. from run 1's final weights on data/smollm2/train-6k-t1 (3,840 prompts answered at T = 1.0), STEPS2 at LR2;
# 32 anchors, the 8,192-token draft list, the CPU runs' seed, the target's features computed on the device. The
# defaults see as many sequences as the CPU runs (1,200 x 16 = 4,800 x 4 and 400 x 16 = 1,600 x 4) in fewer, larger
# steps at the same peak rates. Then each method's final weights are written in the shipped layout (bf16,
# dspark-bench ship-drafters) to OUT/smollm2-135m/<method>/ and scored held out beside the shipped drafters
# (`data score` on 128 sequences of data/smollm2/heldout-t1, JSON in OUT/heldout-t1.json). They replace the shipped
# ones only if they score better there and on the offline protocol; this script copies nothing into baselines/.
#
#   recipes/gpu_reference.sh OUT     (env: STEPS1=1200 STEPS2=400 BATCH=16 MICRO=16 LR1=6e-4 LR2=3e-4 VOCAB=8192
#                                     ANCHORS=32 SEED=42 DEADLINE=540 DEVICE=auto PY=python3 METHODS="dspark ...")
# CPU dry run: STEPS1=2 STEPS2=2 BATCH=2 MICRO=2 DEVICE=cpu HELDOUT_N=2 recipes/gpu_reference.sh OUT
#
# DEADLINE (seconds from the start, 0 = none) stops the trainings still running then; they checkpoint every
# SAVE_EVERY=100 steps, and running the script again with the same OUT resumes each from its last checkpoint.
# Not yet run on a GPU. The ablations' 13 trainings of 1,920 sequences each took about 110 s side by side on one
# H200 (recipes/gpu_ablation.sh), about 230 sequences a second in all; at that pace these 4 x 25,600 need ~450 s.
set -uo pipefail
cd "$(dirname "$0")/.."
. recipes/common.sh  # opts, say, left, bounded
OUT=${1:?usage: recipes/gpu_reference.sh OUT   (settings in the environment; see the header)}
STEPS1=${STEPS1:-1200}; STEPS2=${STEPS2:-400}; BATCH=${BATCH:-16}; MICRO=${MICRO:-16}
LR1=${LR1:-6e-4}; LR2=${LR2:-3e-4}; VOCAB=${VOCAB:-8192}; ANCHORS=${ANCHORS:-32}; SEED=${SEED:-42}
DEADLINE=${DEADLINE:-540}; DEVICE=${DEVICE:-auto}; SAVE_EVERY=${SAVE_EVERY:-100}; HELDOUT_N=${HELDOUT_N:-128}
DATA1=data/smollm2/train-6k; DATA2=data/smollm2/train-6k-t1; HELDOUT=data/smollm2/heldout-t1
SHIPPED=dspark_bench/drafters/shipped/smollm2-135m
PY=${PY:-python3}
[ -x .venv/bin/python ] && [ "$PY" = python3 ] && PY=.venv/bin/python
read -r -a M <<< "${METHODS:-dspark dflash eagle3 mtp}"
for m in "${M[@]}"; do opts "$m" > /dev/null || exit 2; done  # bad input fails before any work
for d in "$DATA1" "$DATA2" "$HELDOUT"; do
  [ -f "$d/responses.jsonl" ] || { echo "$d/responses.jsonl is missing: the script trains on the committed data" >&2; exit 2; }
done
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONUNBUFFERED=1
CLI=("$PY" -m dspark_bench.cli.main)
T0=$(date +%s)
mkdir -p "$OUT/runs" "$OUT/logs"
"$PY" -c "import torch; print('torch', torch.__version__, '| cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
S=(--batch-size "$BATCH" --micro-batch "$MICRO" --seed "$SEED" --num-anchors "$ANCHORS" --draft-vocab "$VOCAB"
   --save-every "$SAVE_EVERY" --features online --device "$DEVICE" --resume-if-any)
chain() {  # chain METHOD: run 1, then run 2 from its final weights
  local m=$1
  # shellcheck disable=SC2046 # opts prints the method's options, split on purpose
  bounded "${CLI[@]}" train --method "$m" --out "$OUT/runs/$m-1" --data "$DATA1" --steps "$STEPS1" --lr "$LR1" \
    "${S[@]}" $(opts "$m") >> "$OUT/logs/$m-1.log" 2>&1 || { say "$m: run 1 stopped (exit $?)"; return 1; }
  say "$m: run 1 done"
  # shellcheck disable=SC2046
  bounded "${CLI[@]}" train --method "$m" --out "$OUT/runs/$m-2" --data "$DATA2" --steps "$STEPS2" --lr "$LR2" \
    --init-from "$OUT/runs/$m-1/final" "${S[@]}" $(opts "$m") >> "$OUT/logs/$m-2.log" 2>&1 \
    || { say "$m: run 2 stopped (exit $?)"; return 1; }
  say "$m: run 2 done"
}
say "start: ${M[*]}; run 1 $STEPS1 x $BATCH at $LR1, run 2 $STEPS2 x $BATCH at $LR2; deadline ${DEADLINE}s"
pids=()
for m in "${M[@]}"; do chain "$m" & pids+=($!); done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
if [ "$failed" = 1 ]; then
  say "not every training finished: run the script again with the same OUT to resume"
  exit 1
fi
names=(); args=()
for m in "${M[@]}"; do names+=("$m=$m-2"); args+=(--drafter "$SHIPPED/$m" --drafter "$OUT/smollm2-135m/$m"); done
"${CLI[@]}" ship-drafters "$OUT/runs" "$OUT/smollm2-135m" "${names[@]}" > "$OUT/logs/ship.log" 2>&1 \
  || { cat "$OUT/logs/ship.log"; exit 1; }
"${CLI[@]}" data score "${args[@]}" --data "$HELDOUT" --exclude "$DATA1" --exclude "$DATA2" --n "$HELDOUT_N" \
  --device "$DEVICE" --json "$OUT/heldout-t1.json" > "$OUT/logs/score.log" 2>&1 || { cat "$OUT/logs/score.log"; exit 1; }
cat "$OUT/logs/score.log"
say "done: drafters in $OUT/smollm2-135m/, held-out scores (shipped, then these) in $OUT/heldout-t1.json"
