#!/usr/bin/env bash
# Divergence between concurrency 1 and 8: the same prompts, seeds and drafters decoded alone and in batches of 8
# at temperature 1, per dtype; `dspark-bench diverge` finds each request's first divergent token, says which draw
# made it, and judges it (floating-point or unexplained) into OUT/<dtype>-diverge.json. The README's
# reproducibility paragraph quotes what it measured.
#
#   recipes/divergence.sh OUT [LIMIT] [TOKENS] [DTYPES]
#
# LIMIT prompts per dataset of the suite `all` (4 datasets; default 8: 32 requests), TOKENS new tokens (default
# 64), DTYPES a list (default "fp32 bf16"; bf16 runs slower on a CPU without native bf16 matmuls).
# The full size: recipes/divergence.sh OUT 57 128 (201 requests x 128 tokens: AIME 2025 has only 30 prompts, so
# --limit 50 gives 180). Only tokens matter here, so other jobs may share the machine (they slow it, nothing else).
# DRAFTERS (default none,ngram,dspark) and BIN (default .venv/bin) may be set in the environment. A run folder
# left short by an interruption is resumed; a finished one is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: recipes/divergence.sh OUT [LIMIT] [TOKENS] [DTYPES]}
LIMIT=${2:-8}
TOKENS=${3:-64}
DTYPES=${4:-fp32 bf16}
DRAFTERS=${DRAFTERS:-none,ngram,dspark}
BIN=${BIN:-.venv/bin}

for dtype in $DTYPES; do
  for c in 1 8; do
    dir=$OUT/$dtype-c$c
    if [ -f "$dir/summary.json" ]; then
      continue
    elif [ -f "$dir/manifest.json" ]; then
      $BIN/dspark-bench run --resume "$dir"
    else
      $BIN/dspark-bench run --drafter "$DRAFTERS" --suite all --limit "$LIMIT" --max-new-tokens "$TOKENS" \
        --temperature 1.0 --seed 0 --dtype "$dtype" --concurrency "$c" --out "$dir"
    fi
  done
  # exit 1 here means an unexplained divergence: report it and go on to the next dtype
  $BIN/dspark-bench diverge "$OUT/$dtype-c1" "$OUT/$dtype-c8" --out "$OUT/$dtype-diverge.json" \
    || echo "diverge $dtype: exit $? (1: unexplained divergences; see $OUT/$dtype-diverge.json)"
done
