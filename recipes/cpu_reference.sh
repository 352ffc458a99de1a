#!/usr/bin/env bash
# The CPU recipe of the reference drafters for smollm2-135m (baselines/drafters/RECIPE.md, "CPU recipe"):
# data (512 prompts), bf16 target features, then the trainings in two lanes of one torch thread each.
#
#   recipes/cpu_reference.sh [ROOT]        (default ROOT: the repository; writes ROOT/data and ROOT/runs)
#
# Every stage resumes: re-run the same command after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-.}
BIN=${BIN:-.venv/bin}
D=$ROOT/data/smollm2/train-1k
R=$ROOT/runs/smollm2
export OMP_NUM_THREADS=1
mkdir -p "$R"

# 1. 4 shards of 128 prompts of the 1,024-prompt set (the shards depend only on their prompts, the settings and
#    their index, so --max-shards 4 gives the same rows as an uninterrupted run would for prompts 0-511).
if [ "$(wc -l < "$D/responses.jsonl" 2>/dev/null || echo 0)" -lt 512 ]; then
  $BIN/dspark-bench data generate --n 1024 --seed 0 --batch-size 64 --shard-size 128 --max-new-tokens 256 \
    --threads 2 --out "$D" --max-shards $((4 - $(wc -l < "$D/responses.jsonl" 2>/dev/null || echo 0) / 128))
fi
# 2. Target features, computed by the bf16 target (the dtype the drafters run against).
[ -f "$D/features/manifest.json" ] || $BIN/dspark-bench data features --data "$D" --dtype bf16 --threads 2

# 3. Same sequences, order, steps (480 x 4 sequences = 1,920, ~3.8 epochs) and scored predictions per sequence.
S=(--data "$D" --steps 480 --batch-size 4 --micro-batch 4 --seed 42 --save-every 40 --dtype bf16 --threads 1
   --num-anchors 32 --resume-if-any)
train() {  # train NAME METHOD [OPTIONS]: one run folder per name
  local name=$1 method=$2; shift 2
  $BIN/dspark-bench train --method "$method" --out "$R/$name" "${S[@]}" "$@" > "$R/$name.log" 2>&1
}
lane_a() {
  train dspark dspark --num-layers 2 --markov-rank 64 --block-size 7 --decay-gamma 4
  train eagle3 eagle3 --ttt-length 7
}
lane_b() {
  train dflash dflash --num-layers 2 --block-size 7 --decay-gamma 4
  train mtp mtp
  train dspark-1l dspark --num-layers 1 --markov-rank 64 --block-size 7 --decay-gamma 4  # Figure 3 ablation
}
lane_a & A=$!
lane_b & B=$!
wait $A; wait $B
echo "done: $R/*/final"
