#!/usr/bin/env bash
# Measure the CI gate's error rates at its configured size (issue "CI performance regression gates"):
# the unchanged drafters rerun with 10 other seeds (noise: should pass), and degraded drafters (should fail),
# each compared with the committed baseline exactly as `make gate` does.
#
#   scripts/gate_power.sh OUT [SEEDS]        (SEEDS: how many unchanged reruns, default 10)
#
# Writes OUT/<case>/{t1,gate.md,verdict} and OUT/summary.md. Two lanes of one torch thread each; re-running
# skips the runs already made and re-judges every case with the current gate code.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: scripts/gate_power.sh OUT [SEEDS]}
SEEDS=${2:-10}
BIN=${BIN:-.venv/bin}
BASELINE=${BASELINE:-baselines/smollm2-gate}
export OMP_NUM_THREADS=1
mkdir -p "$OUT"
# The same sampled run as `make gate` (Makefile GATE_RUN) with another seed and extra drafter options; the
# baseline's temperature-0 and lossless rows are not rerun (the gate reports them n/a), only sampled metrics.
case_run() {  # case_run NAME SEED [--drafter-opt ...]
  local name=$1 seed=$2; shift 2
  [ -f "$OUT/$name/verdict" ] && return 0
  rm -rf "$OUT/$name"
  $BIN/dspark-bench run --target smollm2-135m --suite all --max-new-tokens 64 --concurrency 8 --limit 10 \
    --temperature 1.0 --dtype bf16 --seed "$seed" --out "$OUT/$name/t1" "$@" > "$OUT/$name.log" 2>&1
  judge "$name"
}
judge() {  # judge NAME: compare a case's run with the baseline (cheap; the summary re-judges every case)
  local rc=0
  rm -f "$OUT/$1/gate.md"  # --markdown appends (as to a CI job summary)
  $BIN/dspark-bench gate --baseline "$BASELINE" "$OUT/$1/t1" --markdown "$OUT/$1/gate.md" > "$OUT/$1/gate.log" 2>&1 || rc=$?
  case $rc in 0) echo pass ;; 1) echo fail ;; *) echo "error (exit $rc, see $OUT/$1/gate.log)" ;; esac > "$OUT/$1/verdict"
}
lane() {  # lane K: every other case
  local k=$1 i=0
  for s in $(seq 1 "$SEEDS"); do
    [ $((i % 2)) -eq "$k" ] && case_run "same-seed$s" $((980406 + 7919 * s))
    i=$((i + 1))
  done
  if [ "$k" -eq 0 ]; then
    for p in 0.3 1.0; do case_run "degraded-dspark-perturb$p" $((980406 + 104729)) --drafter-opt "dspark.perturb=$p"; done
  else
    case_run degraded-dspark-markov-off $((980406 + 130363)) --drafter-opt dspark.markov=false
    for p in 0.6 3.0; do case_run "degraded-dspark-perturb$p" $((980406 + 104729)) --drafter-opt "dspark.perturb=$p"; done
  fi
}
lane 0 & A=$!
lane 1 & B=$!
wait $A; wait $B
for d in "$OUT"/*/; do [ -d "$d/t1" ] && judge "$(basename "$d")"; done  # with the gate code of this checkout
{
  echo "| case | verdict | failed checks |"
  echo "|---|---|---|"
  for d in "$OUT"/*/; do
    name=$(basename "$d")
    [ -f "$d/verdict" ] || continue
    failed=$(grep -c '\*\*FAIL\*\*' "$d/gate.md" 2>/dev/null || true)
    rows=$(grep '\*\*FAIL\*\*' "$d/gate.md" 2>/dev/null | awk -F'|' '{gsub(/ /,"",$2); gsub(/^ +| +$/,"",$3); printf "%s %s; ", $2, $3}')
    echo "| $name | $(cat "$d/verdict") | ${failed:-0}: ${rows} |"
  done
} > "$OUT/summary.md"
cat "$OUT/summary.md"
