#!/usr/bin/env bash
# The offline ablations (paper Figures 3 and 4) and the full-size offline protocol, in one go on one GPU.
#
#   recipes/gpu_ablation.sh OUT            (env: STEPS=480 LIMIT=32 FULL=100 MAXNEW=256 CONC=32 DEADLINE=0 PY=python3)
#
# Every drafter is trained with the CPU recipe of the shipped ones (baselines/drafters/RECIPE.md: same data
# data/smollm2/train-1k, 480 steps x 4 sequences, 32 anchors, lr 6e-4, decay gamma_w 4, seed 42), only with the
# target's features computed online on the GPU instead of read from the CPU's bf16 cache:
#
# * Figure 4, proposal length: dspark (Markov head), dspark-rnn (the RNN head) and dflash, 2 backbone layers, at
#   block sizes G = 3, 7, 11, 15 draft tokens (the paper's draft lengths 4, 8, 12, 16 count the anchor: G + 1);
# * Figure 3, depth: dspark with 1 backbone layer at G = 7, against the 2-layer dspark7 and dflash7 above.
#
# Each drafter is evaluated as soon as it is trained: the offline protocol (T = 1, fixed proposals of G tokens, no
# scheduler, 256 new tokens, fixed seeds) on LIMIT prompts per dataset. Beside the trainings, the shipped drafters
# run the protocol at full size (FULL prompts per dataset, where the data has them): stage a = none, dspark,
# dflash; stage b = none, eagle3, mtp. All jobs share the GPU, so tokens/s are for comparisons inside one run only.
#
# Layout: OUT/train/NAME (training runs), OUT/eval/NAME (run folders), OUT/logs/NAME.{train,eval}.log.
# DEADLINE (seconds from the start, 0 = none) stops jobs still running then: a run's records written so far are kept;
# dspark-bench study ablation-table then uses the complete prefix of each run's prompts only.
#
# Measured on one H200 (2026-11-30, baselines/ablation-smollm2/README.md): the 13 trainings, run at once, took
# 102-112 s each; the evaluations are bound by the engine's CPU-side sampling, about 4 minutes per 32-prompt chunk
# per process with 15 processes, so the whole script needs about 2 + 30 minutes (the stages full-a/full-b alone,
# 11 chunks x 3 drafters each, most of that). A 9-minute lease finished the trainings and 32 prompts of each ablation.
set -uo pipefail
cd "$(dirname "$0")/.."
. recipes/common.sh  # say, left, bounded
OUT=${1:?usage: recipes/gpu_ablation.sh OUT}
STEPS=${STEPS:-480}; LIMIT=${LIMIT:-32}; FULL=${FULL:-100}; MAXNEW=${MAXNEW:-256}; CONC=${CONC:-32}
DEADLINE=${DEADLINE:-0}; PY=${PY:-python3}; DATA=${DATA:-data/smollm2/train-1k}
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
T0=$(date +%s)
mkdir -p "$OUT/train" "$OUT/eval" "$OUT/logs"
CLI=("$PY" -m dspark_bench.cli.main)
TRAIN=(--data "$DATA" --steps "$STEPS" --batch-size 4 --micro-batch 4 --seed 42 --num-anchors 32 --decay-gamma 4
       --save-every "$STEPS" --dtype bf16 --features online --resume-if-any)
PROTOCOL=(--suite all --max-new-tokens "$MAXNEW" --temperature 1.0 --scheduler fixed --concurrency "$CONC")

chain() {  # chain NAME METHOD G OPTIONS...: train, then evaluate at block size G
  local name=$1 method=$2 g=$3; shift 3
  bounded "${CLI[@]}" train --method "$method" --out "$OUT/train/$name" --block-size "$g" "${TRAIN[@]}" "$@" \
    > "$OUT/logs/$name.train.log" 2>&1 || { say "$name: training failed (exit $?)"; return 1; }
  say "$name: trained"
  bounded "${CLI[@]}" run --drafter "$method" --drafter-opt "$method.checkpoint=$OUT/train/$name/final" \
    --block-size "$g" --limit "$LIMIT" "${PROTOCOL[@]}" --out "$OUT/eval/$name" > "$OUT/logs/$name.eval.log" 2>&1
  say "$name: evaluated (exit $?)"
}
stage() {  # stage NAME DRAFTERS: the shipped drafters at full size
  bounded "${CLI[@]}" run --drafter "$2" --block-size 7 --limit "$FULL" "${PROTOCOL[@]}" --out "$OUT/eval/$1" \
    > "$OUT/logs/$1.eval.log" 2>&1
  say "stage $1: done (exit $?)"
}

say "start: $STEPS steps, ablations on $LIMIT prompts per dataset, protocol on $FULL, concurrency $CONC"
stage full-a none,dspark,dflash &
stage full-b none,eagle3,mtp &
for g in 3 7 11 15; do
  chain "dspark$g" dspark "$g" --num-layers 2 --markov-rank 64 &
  chain "dspark-rnn$g" dspark "$g" --num-layers 2 --markov-rank 64 --markov-head rnn &
  chain "dflash$g" dflash "$g" --num-layers 2 &
done
chain dspark-1l7 dspark 7 --num-layers 1 --markov-rank 64 &
wait
say "all jobs ended"
