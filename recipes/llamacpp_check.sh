#!/usr/bin/env bash
# llama.cpp's server (llama-server) with the embedded target, measured and checked through `--engine openai`:
# its ngram-simple speculation (8 draft tokens, lookup n-gram of 3) on the f32 weights, then the same server on
# Q4_0 weights as a negative control (its law is not the fp32 target's, so the lossless check must fail it).
#
#   recipes/llamacpp_check.sh OUT
#
# Writes OUT/run-ngram-simple8-f32/ (run: code and math, 4 prompts each, 64 new tokens, concurrency 4),
# OUT/lossless-ngram-simple8-f32-seed{0,1}.json and OUT/lossless-ngram-simple8-q4_0.json (check-lossless --mode
# fast), OUT/servers/*.log (the first 80 lines of each server's log: its settings) and OUT/llama-server.txt (the
# build). About 5 minutes on the 2-vCPU development machine
# once llama-server is built; the build (llama-cpp-python's vendored llama.cpp sources, from PyPI: no other download)
# takes about 8 minutes more and is kept in LLAMA_WORK (default /tmp/dspark-llamacpp), as are the GGUF files.
# Servers listen on 127.0.0.1 only, on free ports, and are stopped by their process group at the end, also on
# failure. BIN (default .venv/bin) is where dspark-bench lives.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: recipes/llamacpp_check.sh OUT}
BIN=${BIN:-.venv/bin}
WORK=${LLAMA_WORK:-/tmp/dspark-llamacpp}
VERSION=0.3.36  # llama-cpp-python, whose sdist vendors llama.cpp (build b1-0c1e570 as measured on 2026-12-07)
mkdir -p "$OUT/servers" "$WORK/servers"
rm -f "$OUT/verdicts.txt"
WORK=$(realpath "$WORK")
SRC=$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp

if [ ! -x "$SRC/build/bin/llama-server" ] || [ ! -x "$SRC/build/bin/llama-quantize" ]; then
  "$BIN/python" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
  tar xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
  cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON > "$WORK/cmake.log"
  cmake --build "$SRC/build" --target llama-server llama-quantize -j "$(nproc)" > "$WORK/build.log"
fi
"$SRC/build/bin/llama-server" --version > "$OUT/llama-server.txt" 2>&1 || true

MODEL=$("$BIN/python" -c "from dspark_bench.target.model import resolve_target; print(resolve_target('smollm2-135m'))")
if [ ! -f "$WORK/smol-f32.gguf" ]; then
  # the converter imports sentencepiece before it looks for a tokenizer.model (SmolLM2 has none): install it aside
  "$BIN/python" -m pip install -q --no-deps --target "$WORK/py" sentencepiece
  PYTHONPATH="$SRC/gguf-py:$WORK/py" "$BIN/python" "$SRC/convert_hf_to_gguf.py" "$MODEL" --outtype f32 \
    --outfile "$WORK/smol-f32.gguf" > "$WORK/convert.log" 2>&1
fi
[ -f "$WORK/smol-q4_0.gguf" ] || "$SRC/build/bin/llama-quantize" "$WORK/smol-f32.gguf" "$WORK/smol-q4_0.gguf" Q4_0 \
  > "$WORK/quantize.log" 2>&1

PIDS=()
stop() {
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done; wait 2>/dev/null || true
  for log in "$WORK"/servers/*.log; do [ -f "$log" ] && head -80 "$log" > "$OUT/servers/$(basename "$log")"; done
}
trap stop EXIT
free_port() { "$BIN/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

start() {  # start LABEL GGUF: llama-server in its own process group on port $PORT, waited for (at most 120 s)
  local label=$1 gguf=$2 port
  port=$(free_port)
  setsid "$SRC/build/bin/llama-server" -m "$gguf" --host 127.0.0.1 --port "$port" -c 8192 -np 4 -t "$(nproc)" \
    --spec-type ngram-simple --spec-draft-n-max 8 --spec-ngram-simple-size-n 3 --metrics --no-webui \
    > "$WORK/servers/$label.log" 2>&1 &
  PIDS+=($!)
  PORT=$port
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && return 0
    kill -0 "$!" 2>/dev/null || break
    sleep 1
  done
  echo "server $label did not come up; see $WORK/servers/$label.log" >&2
  return 1
}

SPEC='{"method": "ngram-simple", "num_speculative_tokens": 8}'
start f32 "$WORK/smol-f32.gguf"
URL=http://127.0.0.1:$PORT/v1
"$BIN/dspark-bench" run --engine openai --base-url "$URL" --server-label ngram-simple8 --suite code,math --limit 4 \
  --max-new-tokens 64 --concurrency 4 --out "$OUT/run-ngram-simple8-f32" > "$OUT/run.log" 2>&1
for seed in 0 1; do
  rc=0
  "$BIN/dspark-bench" check-lossless --engine openai --base-url "$URL" --server-spec "$SPEC" --mode fast \
    --seed "$seed" --out "$WORK/check-f32-$seed" > "$OUT/lossless-f32-seed$seed.log" 2>&1 || rc=$?
  echo "f32 seed $seed: exit $rc" >> "$OUT/verdicts.txt"
  cp "$WORK/check-f32-$seed/lossless.json" "$OUT/lossless-ngram-simple8-f32-seed$seed.json"
done
start q4_0 "$WORK/smol-q4_0.gguf"
rc=0
"$BIN/dspark-bench" check-lossless --engine openai --base-url "http://127.0.0.1:$PORT/v1" --server-spec "$SPEC" \
  --mode fast --out "$WORK/check-q4_0" > "$OUT/lossless-q4_0.log" 2>&1 || rc=$?
echo "q4_0 seed 0: exit $rc" >> "$OUT/verdicts.txt"
cp "$WORK/check-q4_0/lossless.json" "$OUT/lossless-ngram-simple8-q4_0.json"
cat "$OUT/verdicts.txt"
