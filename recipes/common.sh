# Shell helpers shared by the training and GPU scripts; sourced (`. recipes/common.sh`) from the repository root.

# opts METHOD: the architecture options of each shipped reference drafter (baselines/drafters/RECIPE.md)
opts() {
  case $1 in
    dspark) echo --num-layers 2 --markov-rank 64 --block-size 7 --decay-gamma 4 ;;
    dflash) echo --num-layers 2 --block-size 7 --decay-gamma 4 ;;
    eagle3) echo --ttt-length 7 ;;
    mtp) echo ;;
    *) echo "unknown method $1 (methods: dspark dflash eagle3 mtp)" >&2; return 2 ;;
  esac
}

# A deadline for a leased machine: the caller sets T0 (its start, epoch seconds) and DEADLINE (seconds from T0;
# 0 = none).
say() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
left() {  # seconds left before DEADLINE (a day when there is none)
  if [ "$DEADLINE" -gt 0 ]; then echo $(( DEADLINE - ($(date +%s) - T0) )); else echo 86400; fi
}
bounded() {  # bounded CMD...: run CMD, stopped (SIGINT, then SIGKILL 15 s later) at the deadline
  local s; s=$(left)
  [ "$s" -gt 5 ] || { echo "no time left for: $*"; return 124; }
  timeout -s INT -k 15 "$s" "$@"
}
