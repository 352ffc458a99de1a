#!/usr/bin/env bash
# Train the four reference drafters (dspark, dflash, eagle3, mtp) for one target, end to end, in one go:
# convert the target, regenerate the training data with it, train every method on the same data with the same
# budget, and leave the checkpoints in OUT/<target>/<method>/ (the layout of baselines/drafters/).
#
#   scripts/gpu_reference.sh OUT [--n 4000] [--steps 300] [--batch 16] [--micro 4] [--max-new 384]
#                                [--gen-batch 512] [--threads N] [--target smollm2-135m]
#
# Defaults are sized for ~8 minutes on one H200 (see baselines/drafters/RECIPE.md for the estimate).
# CPU dry run:  scripts/gpu_reference.sh /tmp/ref --n 16 --steps 4 --batch 4 --micro 2 --max-new 32 --gen-batch 8 --threads 1
# Re-running with the same OUT resumes: generation skips finished shards, training continues from checkpoints.
set -euo pipefail

usage() { sed -n '2,12p' "$0"; exit 2; }
[ $# -ge 1 ] || usage
OUT=$1; shift
N=4000; STEPS=300; BATCH=16; MICRO=4; MAX_NEW=384; GEN_BATCH=512; THREADS=""; TARGET=smollm2-135m
while [ $# -gt 0 ]; do
  case $1 in
    --n) N=$2 ;; --steps) STEPS=$2 ;; --batch) BATCH=$2 ;; --micro) MICRO=$2 ;; --max-new) MAX_NEW=$2 ;;
    --gen-batch) GEN_BATCH=$2 ;; --threads) THREADS=$2 ;; --target) TARGET=$2 ;;
    *) echo "unknown argument $1"; usage ;;
  esac
  shift 2
done

cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
echo "== environment"
$PY -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__, '| cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" \
  || { echo "error: python needs torch and transformers ($PY)"; exit 1; }
$PY -c "import dspark_bench" 2>/dev/null || $PY -m pip install -q -e . --no-deps
CLI="$PY -m dspark_bench.train.cli"
COMMON=(--device auto)
[ -n "$THREADS" ] && COMMON+=(--threads "$THREADS")
DEVICE=$($PY -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
mkdir -p "$OUT"
NAME=$(basename "$TARGET")
T0=$(date +%s.%N)
TIMINGS=()
mark() {  # mark LABEL START: record the seconds since START
  local s; s=$(awk -v a="$(date +%s.%N)" -v b="$2" 'BEGIN { printf "%.1f", a - b }')
  TIMINGS+=("\"$1\": $s"); echo "== $1 done in ${s}s"
}

echo "== 1/4 target ($TARGET)"
t=$(date +%s.%N)
$PY -c "from dspark_bench.target import resolve_target; print(resolve_target('$TARGET'))"
mark convert_s "$t"

echo "== 2/4 data: $N prompts, max $MAX_NEW new tokens, batches of $GEN_BATCH"
t=$(date +%s.%N)
$CLI data generate --target "$TARGET" --n "$N" --out "$OUT/data" --max-new-tokens "$MAX_NEW" \
  --batch-size "$GEN_BATCH" --shard-size "$GEN_BATCH" "${COMMON[@]}"
mark generate_s "$t"

if [ "$DEVICE" = cpu ] && [ ! -f "$OUT/data/features/manifest.json" ]; then
  echo "== 3/4 target features (CPU: cached once for all four methods)"
  t=$(date +%s.%N)
  $CLI data features --data "$OUT/data" "${COMMON[@]}"
  mark features_s "$t"
elif [ "$DEVICE" = cpu ]; then
  echo "== 3/4 target features: cached in $OUT/data/features (already there)"
else
  echo "== 3/4 target features: computed on the fly (cuda)"
fi

echo "== 4/4 training: $STEPS steps x $BATCH sequences per method"
SHARED=(--data "$OUT/data" --steps "$STEPS" --batch-size "$BATCH" --micro-batch "$MICRO" --save-every 100 --seed 42 --resume)
declare -A EXTRA=(
  [dspark]="--num-layers 2 --markov-rank 64 --block-size 7 --num-anchors 512 --decay-gamma 4"
  [dflash]="--num-layers 2 --block-size 7 --num-anchors 512 --decay-gamma 4"
  [eagle3]="--ttt-length 7"
  [mtp]=""
)
for m in dspark dflash eagle3 mtp; do
  t=$(date +%s.%N)
  # shellcheck disable=SC2086
  $CLI train --method "$m" --out "$OUT/runs/$m" "${SHARED[@]}" ${EXTRA[$m]} "${COMMON[@]}"
  mkdir -p "$OUT/$NAME" && rm -rf "${OUT:?}/$NAME/$m" && cp -r "$OUT/runs/$m/final" "$OUT/$NAME/$m"
  mark "train_${m}_s" "$t"
done

mark total_s "$T0"
{
  echo "{"
  echo "  \"device\": \"$DEVICE\", \"target\": \"$TARGET\", \"n\": $N, \"steps\": $STEPS, \"batch\": $BATCH,"
  echo "  \"max_new_tokens\": $MAX_NEW, \"gen_batch\": $GEN_BATCH,"
  (IFS=,; echo "  ${TIMINGS[*]}")
  echo "}"
} > "$OUT/timings.json"
echo "== checkpoints in $OUT/$NAME/{dspark,dflash,eagle3,mtp}; timings in $OUT/timings.json"
cat "$OUT/timings.json"
