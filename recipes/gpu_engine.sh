#!/usr/bin/env bash
# Engine benchmark: overhead share, Markov-head share and our `none` vs HF generate(), with the
# embedded target (SmolLM2-135M), through `dspark-bench bench`. Writes OUT/bench.json and OUT/bench.log.
#
#   recipes/gpu_engine.sh OUT          on a CUDA machine: concurrency 1-64, 64 prompts, bf16, within 10 minutes
#   recipes/gpu_engine.sh OUT smoke    anywhere (CPU): the same command at tiny settings (what the test runs)
#
# BIN (default .venv/bin) is where dspark-bench lives. Goals on an H200: overhead share <= 5%, Markov head
# <= 2% of a DSpark round, ours/HF >= 1.0 at c=1 and c=8.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: recipes/gpu_engine.sh OUT [smoke]}
MODE=${2:-full}
BIN=${BIN:-.venv/bin}
mkdir -p "$OUT"
case "$MODE" in
  full)
    $BIN/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: use smoke')"
    ARGS=(--limit 16 --max-new-tokens 64 --repeats 1 --concurrency 1,2,4,8,16,32,64 --hf-batch 8 --dtype bf16)
    LIMIT=600 ;;
  smoke)
    export OMP_NUM_THREADS=1
    ARGS=(--suite code --limit 2 --max-new-tokens 6 --repeats 1 --concurrency 1,2 --hf-batch 2 --dtype fp32
          --device cpu --threads 1)
    LIMIT=300 ;;
  *) echo "unknown mode $MODE: use full or smoke" >&2; exit 2 ;;
esac
timeout "$LIMIT" "$BIN/dspark-bench" bench --target smollm2-135m --drafters none,ngram,dspark "${ARGS[@]}" \
  --out "$OUT" 2>&1 | tee "$OUT/bench.log"
