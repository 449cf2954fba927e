#!/usr/bin/env bash
# bench/elastic.sh: how soon examples/train.lua steps again after a failure,
# on 3 local host agents x 2 procs (real agents and procs over TCP):
#   host   the last host's agent killed with SIGKILL (its procs die with it):
#          the survivors go on without it (mesh:survivors())
#   proc   one proc killed (its agent lives): it is restarted and the weights
#          are restored from the last in-memory snapshot (the baseline)
#   join   a host agent started with --join at step 100 (3 hosts + 1): from
#          the joined agent connected to its new procs stepping (spawn, and
#          every tensor copied from a peer)
# Prints the median of RUNS runs of each, from the same session.
#   bench/elastic.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
runs=${1:-5}
export MONARCH_TOKEN=${MONARCH_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export OPENBLAS_NUM_THREADS=1
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT

. bench/agents.sh

# One run: prints the seconds from the kill to the next step.
one() {
  start_agents 3
  local out
  out=$($B/bin/monarch-run --hostfile "$dir/hosts" examples/train.lua --procs 2 --quiet \
    --checkpoint-dir "$dir/ck" "$@" 2>&1) || { echo "train.lua failed: $out" >&2; exit 1; }
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  pids=()
  echo "$out" | sed -n 's/.*stepping again \([0-9.]*\) s after.*/\1/p' | head -1
}

# One join run: train.lua on 3 agents holds step 100 until a 4th joins.
one_join() {
  start_agents 3
  local out="$dir/join.out" addr=""
  ( $B/bin/monarch-run --hostfile "$dir/hosts" --listen-joins 127.0.0.1:0 examples/train.lua --procs 2 --quiet \
      --checkpoint-dir "$dir/ck" --wait-join-at 100 >"$out" 2>&1 ) &
  local run=$!
  for _ in $(seq 1 300); do
    addr=$(sed -n 's/.*listening for joining hosts on \([0-9.]*:[0-9]*\).*/\1/p' "$out" | head -1)
    [ -n "$addr" ] && break
    sleep 0.02
  done
  $B/bin/monarch-worker --join "$addr" --listen 127.0.0.1:0 >"$dir/joiner.log" 2>&1 &
  pids+=($!)
  wait "$run" || { echo "train.lua failed: $(cat "$out")" >&2; exit 1; }
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  pids=()
  sed -n 's/.*stepping again \([0-9.]*\) s after the host joined.*/\1/p' "$out" | head -1
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

host=() proc=() join=()
for _ in $(seq 1 "$runs"); do
  host+=("$(one --kill-host-at 100)")
  proc+=("$(one --kill-at 100)")
  join+=("$(one_join)")
done
h=$(printf '%s\n' "${host[@]}" | median)
p=$(printf '%s\n' "${proc[@]}" | median)
j=$(printf '%s\n' "${join[@]}" | median)
echo "elastic bench ($(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)): train.lua on 3 agents x 2 procs, median of $runs"
printf '%-58s %8s s   (runs: %s)\n' "host killed -> stepping again on the survivors" "$h" "${host[*]}"
printf '%-58s %8s s   (runs: %s)\n' "proc killed -> restarted, restored, stepping again (baseline)" "$p" "${proc[*]}"
printf '%-58s %8s\n' "target: host kill to stepping again" "< 2 s"
printf '%-58s %8s s   (runs: %s)\n' "host joined -> its procs stepping (spawn + state from a peer)" "$j" "${join[*]}"
