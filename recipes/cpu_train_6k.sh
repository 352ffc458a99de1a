#!/usr/bin/env bash
# The larger training budget on a CPU (baselines/drafters/RECIPE.md section 5): the 6,144-prompt data, fp32 target
# features, then the chosen methods in two lanes of one torch thread each, 4,800 steps of 4 sequences (10x the
# shipped recipe's 480), 32 anchors, over a reduced draft vocabulary of 8,192 tokens.
#
#   METHODS="dspark dflash eagle3 mtp" recipes/cpu_train_6k.sh [ROOT]   (writes ROOT/runs/smollm2-6k/<method>/)
#
# Every stage resumes when the script is run again: the data at its last complete shard, the feature cache at its
# last shard, each training at its last checkpoint (every 200 steps). None of that is committed (the cache is about
# 11 GB, a training's resume checkpoint 50-180 MB), so it resumes only where the machine is kept: put ROOT
# outside the work tree (e.g. /root/dspark-train), which a fresh checkout may replace. Settings
# (environment):
#   METHODS   any of dspark dflash eagle3 mtp (default all four); STEPS=4800, VOCAB=8192, BIN=.venv/bin
#   SAMPLING  reference (default): the prompts of seed 0 answered at T = 0.7, top-p 0.8, top-k 20 (reference
#             section 7.2), the committed data/smollm2/train-6k; t1: the prompts of seed 1 answered at T = 1.0 by
#             pure softmax, the offline protocol's sampling, data/smollm2/train-6k-t1
#   DATA, FEATURES  default data/smollm2/<that name> and ROOT/features/<that name>
#   SHARDS    train on the first SHARDS shards of DATA only, copied to ROOT/data/<name>-<SHARDS> (features in
#             ROOT/features/<name>-<SHARDS>), e.g. while the rest is still to be generated; no generation then
#   GENERATE=1 (0: use DATA as it is), RUN=smollm2-6k (the runs' folder under ROOT/runs), SEED=42 (data order, anchors)
#   INIT      a folder holding one checkpoint per method, e.g. dspark_bench/drafters/shipped/smollm2-135m: each run starts
#             from INIT/<method>'s weights with its own warm-up and cosine (default: fresh weights)
#   HELDOUT   a data folder whose first 128 usable sequences each run scores every HELDOUT_EVERY=400 steps
#             (`train --heldout`, leaving out the prompts of both training sets), e.g. data/smollm2/heldout-t1
#   LR        peak learning rate (default 6e-4, the recipe's; a fine-tune from INIT may want less)
# fp32 throughout: on a CPU without AVX-512-BF16 the bf16 target is many times slower (RECIPE section 5: a
# training step 15x, the feature pass over 4x).
set -euo pipefail
cd "$(dirname "$0")/.."
. recipes/common.sh  # opts: the shipped architectures
ROOT=${1:-.}
BIN=${BIN:-.venv/bin}
case ${SAMPLING:-reference} in
  reference) SAMPLE=(--seed 0 --temperature 0.7 --top-p 0.8 --top-k 20); NAME=train-6k ;;
  t1) SAMPLE=(--seed 1 --temperature 1.0 --top-p 1.0 --top-k 49152); NAME=train-6k-t1 ;;
  *) echo "SAMPLING=$SAMPLING: use reference or t1" >&2; exit 2 ;;
esac
D=${DATA:-data/smollm2/$NAME}
R=$ROOT/runs/${RUN:-smollm2-6k}
F=${FEATURES:-$ROOT/features/$NAME}
STEPS=${STEPS:-4800}
VOCAB=${VOCAB:-8192}
read -r -a M <<< "${METHODS:-dspark dflash eagle3 mtp}"
for m in "${M[@]}"; do  # bad input fails before any work
  opts "$m" > /dev/null
  if [ -n "${INIT:-}" ] && [ ! -f "$INIT/$m/model.safetensors" ]; then
    echo "INIT=$INIT holds no $m checkpoint ($INIT/$m/model.safetensors)" >&2; exit 2
  fi
done
mkdir -p "$R"
if [ -n "${SHARDS:-}" ]; then  # a fixed snapshot: the run's data must not grow under its feature cache
  SNAP=$ROOT/data/$NAME-$SHARDS
  F=${FEATURES:-$ROOT/features/$NAME-$SHARDS}
  if [ ! -f "$SNAP/responses.jsonl" ]; then
    mkdir -p "$SNAP"
    $BIN/python - "$D" "$SNAP" "$SHARDS" <<'PY'
import json
import shutil
import sys
from pathlib import Path

from dspark_bench.train.data import MANIFEST, RESPONSES, complete_rows

src, dst, k = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
rows = [r for r in complete_rows(src) if r["shard"] < k]
if len({r["shard"] for r in rows}) < k:
    sys.exit(f"SHARDS={k}: {src} has only {len({r['shard'] for r in rows})} of shards 0..{k - 1} complete")
shutil.copy(src / MANIFEST, dst / MANIFEST)
tmp = dst / (RESPONSES + ".tmp")
tmp.write_text("".join(json.dumps(r) + "\n" for r in sorted(rows, key=lambda r: r["shard"])))
tmp.rename(dst / RESPONSES)
print(f"{len(rows)} rows of shards 0..{k - 1} of {src} in {dst}")
PY
  fi
  D=$SNAP
  GENERATE=0
fi

# 1. The data: complete the 48 shards (committed shards are kept; a shard depends only on its prompts and index).
if [ "${GENERATE:-1}" = 1 ]; then
  $BIN/dspark-bench data generate --n 6144 "${SAMPLE[@]}" --batch-size 64 --shard-size 128 --max-new-tokens 256 \
    --dtype fp32 --threads 2 --out "$D"
fi
# 2. Target features of every sequence, cached once for all methods (both cores; returns at once when complete).
$BIN/dspark-bench data features --data "$D" --out "$F" --dtype fp32 --threads 2

# 3. Same sequences, order, steps and scored predictions for every method; two lanes of one thread each.
S=(--data "$D" --features "$F" --steps "$STEPS" --batch-size 4 --micro-batch 4 --seed "${SEED:-42}" --save-every 200
   --dtype fp32 --threads 1 --num-anchors 32 --draft-vocab "$VOCAB" --resume-if-any --lr "${LR:-6e-4}")
if [ -n "${HELDOUT:-}" ]; then
  S+=(--heldout "$HELDOUT" --heldout-n 128 --heldout-every "${HELDOUT_EVERY:-400}")
  for x in data/smollm2/train-6k data/smollm2/train-6k-t1; do
    if [ -f "$x/manifest.json" ]; then S+=(--heldout-exclude "$x"); fi
  done
fi
train() {  # train METHOD: one run folder per method
  local init=()
  if [ -n "${INIT:-}" ]; then init=(--init-from "$INIT/$1"); fi
  # shellcheck disable=SC2046 # opts prints the method's options, split on purpose
  OMP_NUM_THREADS=1 $BIN/dspark-bench train --method "$1" --out "$R/$1" "${S[@]}" "${init[@]}" $(opts "$1") \
    >> "$R/$1.log" 2>&1
}
lane() {  # lane OFFSET: every second method from OFFSET
  local i
  for ((i = $1; i < ${#M[@]}; i += 2)); do train "${M[$i]}"; done
}
lane 0 & A=$!
lane 1 & B=$!
wait $A
wait $B
for m in "${M[@]}"; do echo "$m: $R/$m/final"; done
