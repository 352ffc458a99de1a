#!/usr/bin/env bash
# Engine benchmark with the embedded target (SmolLM2-135M), in two stages:
#   vllm:  our `none` beside vLLM's `none` on the same prompts, interleaved repeats (`bench --against vllm`):
#          OUT/vllm/vs-vllm.json, vs-vllm.md and OUT/vllm.log
#   bench: overhead share, Markov-head share and our `none` vs HF generate() (`bench`): OUT/bench/bench.json and
#          OUT/bench.log
#
#   recipes/gpu_engine.sh OUT                  on a CUDA machine, bf16, both stages within DEADLINE (default 600 s):
#                                              vLLM at concurrency 1, 8, 32 (64 prompts), the bench with what is left
#   recipes/gpu_engine.sh OUT smoke [STAGES]   anywhere (CPU): the same commands at tiny settings (what the tests run)
#   recipes/gpu_engine.sh OUT full STAGES      STAGES: a comma list of vllm and bench (default vllm,bench)
#
# BIN (default .venv-vllm/bin: vLLM's venv, which holds our code too; the bench stage alone runs in .venv) is where
# dspark-bench lives. Goals on an H200: ours/vLLM >= 1.0 in per-request tokens/s at c=1 and in system tokens/s at
# c=8 and 32, TTFT no worse; overhead share <= 5%, Markov head <= 2% of a DSpark round, ours/HF >= 1.0 at c=1 and 8.
set -euo pipefail
cd "$(dirname "$0")/.."
. recipes/common.sh
OUT=${1:?usage: recipes/gpu_engine.sh OUT [full|smoke] [STAGES]}
MODE=${2:-full}
STAGES=${3:-vllm,bench}
BIN=${BIN:-.venv-vllm/bin}
T0=$(date +%s)
case "$MODE" in
  full)
    "$BIN/python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: use smoke')"
    DEADLINE=${DEADLINE:-600}
    # vLLM keeps its CUDA graphs (what its users run); half the GPU for its KV cache leaves ours room beside it
    VLLM_ARGS=(--limit 16 --max-new-tokens 64 --repeats 3 --concurrency 1,8,32 --dtype bf16
               --engine-opt gpu_memory_utilization=0.5)
    VLLM_LIMIT=360
    BENCH_ARGS=(--limit 8 --max-new-tokens 64 --repeats 1 --concurrency 1,8,32,64 --hf-batch 8 --dtype bf16) ;;
  smoke)
    export OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
    DEADLINE=${DEADLINE:-900}
    VLLM_ARGS=(--suite code --limit 2 --max-new-tokens 6 --repeats 2 --concurrency 1,2 --dtype fp32 --device cpu
               --threads 1)
    VLLM_LIMIT=600
    BENCH_ARGS=(--suite code --limit 2 --max-new-tokens 6 --repeats 1 --concurrency 1,2 --hf-batch 2 --dtype fp32
                --device cpu --threads 1) ;;
  *) echo "unknown mode $MODE: use full or smoke" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
for stage in ${STAGES//,/ }; do
  case "$stage" in
    vllm)
      say "vllm: our none beside vLLM's none (at most ${VLLM_LIMIT} s of the $(left) s left)"
      s=$(left); [ "$s" -lt "$VLLM_LIMIT" ] || s=$VLLM_LIMIT
      DEADLINE=$(( $(date +%s) - T0 + s )) bounded "$BIN/dspark-bench" bench --target smollm2-135m --against vllm \
        "${VLLM_ARGS[@]}" --out "$OUT/vllm" 2>&1 | tee "$OUT/vllm.log" ;;
    bench)
      say "bench: overhead shares and ours vs HF generate() ($(left) s left)"
      bounded "$BIN/dspark-bench" bench --target smollm2-135m --drafters none,ngram,dspark "${BENCH_ARGS[@]}" \
        --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log" ;;
    *) echo "unknown stage $stage: use vllm, bench" >&2; exit 2 ;;
  esac
done
say "done: $OUT"
