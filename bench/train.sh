#!/usr/bin/env bash
# bench/train.sh: what monarch.train costs and how fast it survives its controller (issue 28).
#  1. The library against the same loop written by hand: examples/train.lua as it was before the library
#     (git show BASE:examples/train.lua) and as it is, on 4 procs, alternated, ROUNDS runs each; steps per
#     second of the whole loop (the "done:" line), medians and their ratio.
#  2. Controller kill -9 -> training stepping again under a new controller, on 3 local host agents: the same
#     command run again at once, and a --standby controller started beforehand; seconds from the kill (the
#     killed controller's exit) to the new controller's "stepping again" line, medians of ROUNDS, beside the
#     heartbeat timeout (3 s, the standby target's baseline).
#   bench/train.sh [ROUNDS] [cost|loss]   (default 7 rounds, both parts; BASE=e8118b5, the last commit before the
#                                         library)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-7}
PART=${2:-all}
case $PART in all | cost | loss) ;; *) echo "bench/train.sh: the part is cost, loss or nothing (both), not '$PART'" >&2; exit 2 ;; esac
BASE=${BASE:-e8118b5}
B=${MONARCH_BUILD:-build}
export OPENBLAS_NUM_THREADS=1 MONARCH_TOKEN=${MONARCH_TOKEN:-bench-train-$$}
tmp=$(mktemp -d)
agents=()
cleanup() { for p in "${agents[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
data=$PWD/data/digits.csv.gz
[ -f "$data" ] || scripts/fetch-digits.sh "$data"
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
now() { date +%s.%N; }

# ---- 1. the library's cost -----------------------------------------------------------------
if [ "$PART" != loss ]; then
git show "$BASE:examples/train.lua" > "$tmp/train_by_hand.lua"
run_rate() { # script -> steps per second of its loop
  "$B/bin/monarch-run" "$1" --device cpu --procs 4 --epochs 40 --every 0 --quiet --data "$data" |
    awk '/^done:/ { for (i = 1; i <= NF; i++) if ($i == "in") t = $(i+1); print $2 / t }'
}
: > "$tmp/old"; : > "$tmp/new"
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) -eq 1 ]; then # which goes first alternates too: no side always runs on a warmer machine
    run_rate "$tmp/train_by_hand.lua" >> "$tmp/old"; run_rate examples/train.lua >> "$tmp/new"
  else
    run_rate examples/train.lua >> "$tmp/new"; run_rate "$tmp/train_by_hand.lua" >> "$tmp/old"
  fi
done
old=$(median < "$tmp/old"); new=$(median < "$tmp/new")
# Each pair ran back to back: the median of the pairs' ratios is less swayed by the machine's speed drifting
# over the minutes of the whole run than the ratio of the two medians.
pair=$(paste "$tmp/old" "$tmp/new" | awk '{ print $2 / $1 }' | median)
echo "library cost: examples/train.lua on 4 procs, 440 steps, $ROUNDS runs each, alternated"
printf "  by hand (%s): %8.0f steps/s (median)\n  monarch.train: %8.0f steps/s (median)\n" "$BASE" "$old" "$new"
awk -v o="$old" -v n="$new" -v p="$pair" 'BEGIN { printf "  ratio %.3f of the medians, %.3f median of the pairs (step time %+.1f%%; target at most +2%%)\n",
  n / o, p, (1 / p - 1) * 100 }'
printf "  lines: by hand %d, on the library %d (target at most 250)\n" "$(wc -l < "$tmp/train_by_hand.lua")" \
  "$(wc -l < examples/train.lua)"

# The controller's own work per step, counted (callgrind: instructions, not seconds, so the noise above does not
# touch it): the difference between 450 and 50 steps of each script, over 400.
if command -v valgrind > /dev/null; then
  ir() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$B/bin/monarch-run" "$1" --device cpu --procs 4 \
      --steps "$2" --every 0 --quiet --data "$data" 2>&1 >/dev/null | awk '/Collected :/ { print $4; exit }'
  }
  io=$(( ($(ir "$tmp/train_by_hand.lua" 450) - $(ir "$tmp/train_by_hand.lua" 50)) / 400 ))
  in=$(( ($(ir examples/train.lua 450) - $(ir examples/train.lua 50)) / 400 ))
  awk -v o="$io" -v n="$in" 'BEGIN { printf "  controller instructions per step: by hand %d, monarch.train %d (%+.1f%%, %+d)\n", o, n,
    (n / o - 1) * 100, n - o }'
fi

fi
[ "$PART" = cost ] && exit 0

# ---- 2. controller loss --------------------------------------------------------------------
for i in 1 2 3; do
  "$B/bin/monarch-worker" --listen 127.0.0.1:0 > "$tmp/agent$i.log" 2>&1 &
  agents+=($!)
done
for i in 1 2 3; do
  for _ in $(seq 100); do grep -q "listening on" "$tmp/agent$i.log" && break; sleep 0.05; done
done
hosts=$(grep -ho "127.0.0.1:[0-9]*" "$tmp"/agent*.log | paste -sd,)
cmd=("$B/bin/monarch-run" --hosts "$hosts" examples/train.lua --device cpu --procs 2 --steps 2000 --every 0
  --quiet --data "$data")
stamp() { while IFS= read -r line; do echo "$(now) $line"; done; }
# Seconds from t_kill to the "stepping again" line of the stamped output file.
since() { awk -v k="$2" '/controller: stepping again/ { printf "%.3f\n", $1 - k; exit }' "$1"; }
: > "$tmp/rerun"; : > "$tmp/standby"
for r in $(seq "$ROUNDS"); do
  "${cmd[@]}" --die-at 300 > /dev/null 2>&1 || true
  t_kill=$(now)
  "${cmd[@]}" 2>&1 | stamp > "$tmp/out.rerun"
  since "$tmp/out.rerun" "$t_kill" >> "$tmp/rerun"
  ( "${cmd[@]}" --standby 2>&1 | stamp > "$tmp/out.standby" ) &
  sb=$!
  for _ in $(seq 200); do grep -q "standby: waiting" "$tmp/out.standby" 2>/dev/null && break; sleep 0.02; done
  "${cmd[@]}" --die-at 300 > /dev/null 2>&1 || true
  t_kill=$(now)
  wait "$sb" || true
  since "$tmp/out.standby" "$t_kill" >> "$tmp/standby"
done
echo "controller kill -9 -> stepping again (3 local agents, 6 procs, $ROUNDS kills each)"
printf "  the command run again at once: %.3f s median (target under 2 s)\n" "$(median < "$tmp/rerun")"
printf "  a --standby controller:        %.3f s median (target under the heartbeat timeout 3 s + 1 s)\n" \
  "$(median < "$tmp/standby")"
echo "  each: the killed controller's exit to the new one's first step (process start, attach, restore included)"
