#!/usr/bin/env bash
# Full head vs reduced draft vocabulary for ONE drafter checkpoint, side by side on the same
# prompts and seeds: acceptance (tau, first-position acceptance) and drafting cost per round.
#
#   recipes/draft_vocab_compare.sh OUT METHOD CHECKPOINT [VOCAB]
#
# METHOD: dspark | dflash | eagle3 | mtp. CHECKPOINT: one of our drafter folders (e.g. runs/smollm2/dspark/final).
# VOCAB: a list from `dspark-bench data vocab --out FILE`, for a checkpoint trained with the full head; omit it
# for a checkpoint trained with --draft-vocab N (its own list is the reduced run).
# Two runs, each `none` + METHOD: OUT/full (METHOD.draft_vocab=full) and OUT/reduced; then the table
# (OUT/compare.md, OUT/compare.json). A run whose summary.json exists is skipped (re-running resumes).
# Settings (environment): SUITE=all LIMIT=20 MAX_NEW=256 TEMPERATURE=1.0 BLOCK=7 CONCURRENCY=1 REPEATS=2
# THREADS (OMP threads, default 1) BIN=.venv/bin. Timings mean something only on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: recipes/draft_vocab_compare.sh OUT METHOD CHECKPOINT [VOCAB]}
METHOD=${2:?method: dspark | dflash | eagle3 | mtp}
CKPT=${3:?checkpoint folder}
VOCAB=${4:-}
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${THREADS:-1}
P=(--suite "${SUITE:-all}" --limit "${LIMIT:-20}" --max-new-tokens "${MAX_NEW:-256}" --temperature "${TEMPERATURE:-1.0}"
   --block-size "${BLOCK:-7}" --scheduler fixed --concurrency "${CONCURRENCY:-1}" --repeats "${REPEATS:-2}"
   --drafter "none,$METHOD" --drafter-opt "$METHOD.checkpoint=$CKPT")
if [ -z "$VOCAB" ]; then
  $BIN/python - "$CKPT" <<'PY' || { echo "$CKPT ships no draft vocabulary: pass VOCAB (dspark-bench data vocab --out FILE)"; exit 2; }
import sys
from safetensors import safe_open
with safe_open(sys.argv[1] + "/model.safetensors", "pt") as f:
    sys.exit(0 if "draft_vocab" in f.keys() else 1)
PY
  REDUCED=()
else
  REDUCED=(--drafter-opt "$METHOD.draft_vocab=$VOCAB")
fi
mkdir -p "$OUT"
run() {  # run NAME ARGS...
  local name=$1; shift
  [ -f "$OUT/$name/summary.json" ] || $BIN/dspark-bench run "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
}
run full "${P[@]}" --drafter-opt "$METHOD.draft_vocab=full"
run reduced "${P[@]}" "${REDUCED[@]}"
$BIN/dspark-bench study draft-vocab-compare "$OUT/full" "$OUT/reduced" --drafter "$METHOD" --json "$OUT/compare.json" \
  | tee "$OUT/compare.md"
