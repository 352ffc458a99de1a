#!/usr/bin/env bash
# Measure the CI gate's error rates out of sample:
#
#   1. baseline: BASELINE_SEEDS sampled runs of the gate's configuration (Makefile GATE_RUN), pooled into
#      OUT/baseline/baseline.json by `dspark-bench baseline update` (each prompt's counts summed over the seeds);
#   2. calibration: DROP_DRAFTER degraded with --drafter-opt DROP_DRAFTER.perturb=S for each S in PERTURB_LEVELS,
#      on CALIB_SEEDS seeds of their own; the S whose pooled tau ratio is nearest 1 - TARGET_DROP is kept
#      (or give PERTURB=S to skip this phase);
#   3. FRESH seeds used by no phase above and by no earlier measurement (the rules were set on seeds
#      980406 + 7919*s, s = 1..10): each decoded unchanged and with the kept degradation, both judged with
#      `dspark-bench gate --sampled-only --baseline OUT/baseline`.
#
# The degraded runs (phases 2 and 3) decode only what their verdict needs, to save machine time: a calibration
# run DROP_DRAFTER alone (only its tau is read), a fresh degraded run `none` and DROP_DRAFTER (`none` for the
# speedup), judged with `gate --drafters` on exactly the checks the whole gate makes for them, at its levels.
# The whole gate fails at least whenever these checks do, so the detection rate measured is a lower bound of the
# whole gate's. DROP_ALONE=0 decodes every drafter in the degraded runs and judges them whole.
#
#   recipes/gate_power.sh OUT [FRESH]        (FRESH: fresh seeds, default 20)
#
# FRESH_FROM [1] numbers the first fresh seed (seeds 300 + FRESH_FROM ...): after a rule was changed on what some
# fresh seeds showed, they are no longer fresh, and the next measurement starts past them.
#
# Environment (defaults in brackets): STOP_AFTER [unset; "baseline" stops after phase 1], BASELINE_SEEDS [4],
# CALIB_SEEDS [2], PERTURB_LEVELS ["1.0 1.1 1.2 1.3 1.5 2.0 2.5"], PERTURB [calibrated], TARGET_DROP [0.10], DROP_DRAFTER
# [dspark], DROP_ALONE [1], REPEATS [1] (interleaved timing repeats per run: the speedup check's units; its spread
# comes from all seeds), LIMIT [10], MAX_NEW [32], LANES [2] (runs at once, one torch thread each), DRAFTERS [the gate's default
# set], BIN [.venv/bin]. The run is the Makefile's GATE_RUN; keep the two in step. A quick check of the script:
#   DRAFTERS=none,dspark LIMIT=1 MAX_NEW=8 FRESH=1 BASELINE_SEEDS=2 CALIB_SEEDS=1 PERTURB_LEVELS=3.0 REPEATS=1
#
# Writes OUT/base/<seed>/, OUT/baseline/, OUT/calib/<S>-<seed>/, OUT/fresh/{same,drop}-<seed>/ (t1/, gate.md,
# verdict), OUT/perturb (the kept S) and OUT/summary.md: the false-fail rate, the detection rate and the tau
# ratio each degraded run actually had. Re-running skips the runs already made and re-judges every case.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: recipes/gate_power.sh OUT [FRESH]}
FRESH=${2:-20}
FRESH_FROM=${FRESH_FROM:-1}
BIN=${BIN:-.venv/bin}
BASELINE_SEEDS=${BASELINE_SEEDS:-4}
CALIB_SEEDS=${CALIB_SEEDS:-2}
PERTURB_LEVELS=${PERTURB_LEVELS:-"1.0 1.1 1.2 1.3 1.5 2.0 2.5"}
TARGET_DROP=${TARGET_DROP:-0.10}
DROP_DRAFTER=${DROP_DRAFTER:-dspark}
REPEATS=${REPEATS:-1}
LIMIT=${LIMIT:-10}
MAX_NEW=${MAX_NEW:-32}
LANES=${LANES:-2}
DROP_ALONE=${DROP_ALONE:-1}
export OMP_NUM_THREADS=1
mkdir -p "$OUT"
CALIB_SET="" DROP_SET=""  # the drafters a degraded run decodes and is judged on (empty: the whole gate)
if [ "$DROP_ALONE" = 1 ]; then CALIB_SET=$DROP_DRAFTER DROP_SET=none,$DROP_DRAFTER; fi
seed_of() { echo $((980406 + 7919 * $1)); }  # disjoint blocks: base 101.., calib 201.., fresh 301..

run_case() {  # run_case DIR SEED [--drafter-opt ...]: one sampled run of the gate configuration
  local dir=$1 seed=$2; shift 2
  [ -f "$dir/t1/summary.json" ] && return 0
  rm -rf "$dir" && mkdir -p "$dir"
  $BIN/dspark-bench run --target smollm2-135m --suite all --max-new-tokens "$MAX_NEW" --concurrency 8 \
    --limit "$LIMIT" --temperature 1.0 --dtype fp32 --repeats "$REPEATS" --seed "$seed" --out "$dir/t1" \
    ${DRAFTERS:+--drafter "$DRAFTERS"} "$@" \
    > "$dir/run.log" 2>&1 || echo "dspark-bench run exited $?" >> "$dir/run.log"  # judged as an error
}
judge() {  # judge DIR [DRAFTERS]: the gate's verdict on a case (cheap, always redone with this checkout's gate
  local rc=0  # code); DRAFTERS: judge only these drafters' checks (gate --drafters)
  rm -f "$1/gate.md"  # --markdown appends (as to a CI job summary)
  $BIN/dspark-bench gate --sampled-only --baseline "$OUT/baseline" "$1/t1" --markdown "$1/gate.md" \
    ${2:+--drafters "$2"} > "$1/gate.log" 2>&1 || rc=$?
  case $rc in 0) echo pass ;; 1) echo fail ;; *) echo "error (exit $rc, see $1/gate.log)" ;; esac > "$1/verdict"
}
tau_ratio() {  # tau_ratio DIR: the pooled tau ratio of DROP_DRAFTER in a judged case
  grep -E "^\| tau \| $DROP_DRAFTER / all \|" "$1/gate.md" 2>/dev/null | sed -nE 's/.*ratio ([0-9.]+).*/\1/p' | head -1
}
in_lanes() {  # in_lanes: run the queued "DIR SEED [opts]" lines of stdin, LANES at a time
  local jobs=0
  while read -r line; do
    # shellcheck disable=SC2086
    run_case $line < /dev/null &
    jobs=$((jobs + 1))
    if [ "$jobs" -ge "$LANES" ]; then wait -n; jobs=$((jobs - 1)); fi
  done
  wait
}

# 1. the pooled baseline
for i in $(seq 1 "$BASELINE_SEEDS"); do echo "$OUT/base/$(seed_of $((100 + i))) $(seed_of $((100 + i)))"; done | in_lanes
if [ ! -f "$OUT/baseline/baseline.json" ]; then
  $BIN/dspark-bench baseline update "$OUT"/base/*/t1 --name baseline --root "$OUT" > "$OUT/baseline.log" 2>&1
fi

[ "${STOP_AFTER:-}" = baseline ] && exit 0

# 2. the degradation that drops DROP_DRAFTER's tau by about TARGET_DROP
if [ -z "${PERTURB:-}" ]; then
  for p in $PERTURB_LEVELS; do
    for i in $(seq 1 "$CALIB_SEEDS"); do
      echo "$OUT/calib/$p-$(seed_of $((200 + i))) $(seed_of $((200 + i))) ${CALIB_SET:+--drafter $CALIB_SET} --drafter-opt $DROP_DRAFTER.perturb=$p"
    done
  done | in_lanes
  best="" bestgap=""
  for p in $PERTURB_LEVELS; do
    ratios=$(for d in "$OUT"/calib/"$p"-*/; do judge "$d" "$CALIB_SET"; tau_ratio "$d"; done)
    mean=$(echo "$ratios" | awk 'NF {s += $1; n++} END {if (n) printf "%.4f", s / n}')
    gap=$(awk -v m="$mean" -v t="$TARGET_DROP" 'BEGIN {g = m - (1 - t); print (g < 0 ? -g : g)}')
    echo "perturb $p: mean $DROP_DRAFTER tau ratio $mean" >> "$OUT/calibration.txt"
    if [ -z "$best" ] || awk -v a="$gap" -v b="$bestgap" 'BEGIN {exit !(a < b)}'; then best=$p bestgap=$gap; fi
  done
  PERTURB=$best
fi
echo "$PERTURB" > "$OUT/perturb"

# 3. fresh seeds: unchanged and degraded, same seed
for i in $(seq "$FRESH_FROM" $((FRESH_FROM + FRESH - 1))); do
  s=$(seed_of $((300 + i)))
  echo "$OUT/fresh/same-$s $s"
  echo "$OUT/fresh/drop-$s $s ${DROP_SET:+--drafter $DROP_SET} --drafter-opt $DROP_DRAFTER.perturb=$PERTURB"
done | in_lanes
for d in "$OUT"/fresh/same-*/; do judge "$d"; done
for d in "$OUT"/fresh/drop-*/; do judge "$d" "$DROP_SET"; done

# 4. summary
{
  same_n=$(ls -d "$OUT"/fresh/same-*/ | wc -l)
  drop_n=$(ls -d "$OUT"/fresh/drop-*/ | wc -l)
  same_fail=$(cat "$OUT"/fresh/same-*/verdict | grep -c '^fail' || true)
  drop_fail=$(cat "$OUT"/fresh/drop-*/verdict | grep -c '^fail' || true)
  mean_ratio=$(for d in "$OUT"/fresh/drop-*/; do tau_ratio "$d"; done | awk 'NF {s += $1; n++} END {if (n) printf "%.3f", s / n}')
  echo "# Gate error rates, out of sample (FRESH_FROM=$FRESH_FROM recipes/gate_power.sh $OUT $FRESH)"
  echo
  echo "Baseline: $BASELINE_SEEDS pooled seeds; $REPEATS interleaved repeats per run; --limit $LIMIT, $MAX_NEW new tokens."
  echo "Degradation: $DROP_DRAFTER.perturb=$PERTURB (calibration: $(tr '\n' ';' < "$OUT/calibration.txt" 2>/dev/null || echo given))."
  echo
  echo "* unchanged drafters, $same_n fresh seeds: **$same_fail failed** (goal: at most 1 in 20)"
  echo "* $DROP_DRAFTER degraded (mean pooled tau ratio $mean_ratio), same seeds: **$drop_fail of $drop_n failed** (goal: at least 19 of 20)"
  if [ "$DROP_ALONE" = 1 ]; then
    echo "  (each degraded run decoded none and $DROP_DRAFTER only and was judged on the whole gate's checks of those"
    echo "  two, at its levels: the whole gate fails at least as often, so this is a lower bound of its detection)"
  fi
  echo
  echo "| case | verdict | $DROP_DRAFTER tau ratio (pooled) | failed checks |"
  echo "|---|---|---|---|"
  for d in "$OUT"/fresh/*/; do
    rows=$(grep '\*\*FAIL\*\*' "$d/gate.md" 2>/dev/null | awk -F'|' '{gsub(/^ +| +$/,"",$2); gsub(/^ +| +$/,"",$3); printf "%s %s; ", $2, $3}' || true)  # a passing case has no FAIL row (grep exits 1)
    echo "| $(basename "$d") | $(cat "$d/verdict") | $(tau_ratio "$d") | ${rows:-–} |"
  done
} > "$OUT/summary.md"
cat "$OUT/summary.md"
