#!/usr/bin/env bash
# bench/ship.sh: shipping kernel libraries and files to hosts that lack them (issue 30), each figure beside
# its baseline from the same run:
#  1. a LIB_MIB (5) MiB library to AGENTS (32) real local agents in one mount namespace with a private /tmp
#     (so only shipping gets the library there) and one cache in it, as one user's agents on a machine share
#     theirs: the first load (shipped once, to one of them) against a load from a path every host has (the
#     load before shipping) plus one loopback send of the same bytes (build/bench/tcp_stream); the second
#     load (from the cache) against the local load on a second mesh (the two take turns at coming first: the
#     op right after the first load pays for its aftermath). Target: first <= 1.5x (local + send), second within 10%
#     of local. Then the first load again with a private cache per agent (a namespace each: 32 copies);
#  2. SIM_HOSTS (256) simulated hosts (--simulate, SIM_GROUP (64) to a process, whose hosts share one pretend
#     cache): the copies of the bytes the controller wrote (target: at most the fan-out, 16) and the first
#     load's time (target: under 10 s at 4,096 hosts; SIM_GROUP=16 makes 256 caches, 256 copies in the tree);
#  3. a SYNC_MIB (100) MiB folder synced to one host, one 1 KiB file changed, synced again: the bytes of
#     the second sync (target: under 64 KiB) against the first's.
#   REPS=5 AGENTS=32 LIB_MIB=5 SIM_HOSTS=256 SIM_GROUP=64 SYNC_MIB=100 bench/ship.sh   (0 skips a part)
# Needs root (unshare -m) for parts 1 and 3. Kills every process it started.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
reps=${REPS:-5} agents=${AGENTS:-32} mib=${LIB_MIB:-5} sim_hosts=${SIM_HOSTS:-256} sync_mib=${SYNC_MIB:-100}
export MONARCH_TOKEN=${MONARCH_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export OPENBLAS_NUM_THREADS=1
dir=$(mktemp -d) base=$B/bench-ship-$$
pids=()
stop_agents() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
cleanup() { stop_agents; rm -rf "$dir" "$base"; }
trap cleanup EXIT
. bench/agents.sh
get() { echo "$2" | awk -v k="$1" '$1 == k {print $2}'; }
run() {
  local name=$1 out
  shift
  if ! out=$("$@" 2>"$dir/err"); then echo "bench/ship.sh: $name failed: $(head -4 "$dir/err")" >&2; exit 1; fi
  echo "$out"
}
# private_agents N: N agents, each in its own mount namespace with a private /tmp and its cache there.
private_agents() {
  local i t
  : >"$dir/hosts"
  rm -f "$dir"/p*.log
  for i in $(seq 1 "$1"); do
    unshare -m --propagation private sh -c 'mount -t tmpfs tmpfs /tmp && exec "$@"' sh \
      $B/bin/monarch-worker --listen 127.0.0.1:0 --ship-cache /tmp/cache >"$dir/p$i.log" 2>&1 &
    pids+=($!)
  done
  for t in $(seq 1 400); do
    [ "$(cat "$dir"/p*.log | grep -c 'listening on')" -ge "$1" ] && break
    sleep 0.05
  done
  cat "$dir"/p*.log | awk '/listening on/ { a = $0; sub(/.*listening on /, "", a); sub(/ .*/, "", a); print a }' >"$dir/hosts"
  [ "$(wc -l <"$dir/hosts")" -eq "$1" ] || { echo "bench/ship.sh: $1 agents did not all start" >&2; exit 1; }
}
# shared_agents N: N agents in one mount namespace with a private /tmp, sharing one cache there (the agents of
# one user on one machine, one per GPU: the default cache is theirs alike); none sees the controller's /tmp.
shared_agents() {
  local t
  : >"$dir/hosts"
  unshare -m --propagation private sh -c 'mount -t tmpfs tmpfs /tmp || exit 1
    kids=""; trap "kill \$kids 2>/dev/null; exit 0" TERM # (dash lists no jobs in a trap: the pids, kept)
    i=0; while [ $i -lt "$1" ]; do i=$((i + 1)); "$2" --listen 127.0.0.1:0 --ship-cache /tmp/cache & kids="$kids $!"; done
    wait' sh "$1" "$B/bin/monarch-worker" >"$dir/shared.log" 2>&1 &
  pids+=($!)
  for t in $(seq 1 400); do
    [ "$(grep -c 'listening on' "$dir/shared.log")" -ge "$1" ] && break
    sleep 0.05
  done
  awk '/listening on/ { a = $0; sub(/.*listening on /, "", a); sub(/ .*/, "", a); print a }' "$dir/shared.log" >"$dir/hosts"
  [ "$(wc -l <"$dir/hosts")" -eq "$1" ] || { echo "bench/ship.sh: $1 agents did not all start" >&2; exit 1; }
}
# lib OUT VALUE: a kernel library of about LIB_MIB MiB (a constant table) whose kernel returns VALUE.
cat >"$dir/k.c" <<'C'
#include "monarch_kernel.h"
__attribute__((used)) static const char pad[PAD] = {VALUE};
static int k_answer(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) { (void)argc; (void)argv; return mk_return_int(ctx, VALUE + pad[0]); }
static const mk_kernel_t kernels[] = {{"answer", k_answer, "", "a number"}};
MK_EXPORT const mk_library_t *monarch_kernels(void) {
  static const mk_library_t lib = {MK_ABI_VERSION, "shipbench", 1, kernels};
  return &lib;
}
C
lib() { cc -shared -fPIC -O1 -Ikernels -DPAD=$((mib << 20)) -DVALUE="$2" "$dir/k.c" -o "$1"; }
[ -x $B/bench/tcp_stream ] || make -s $B/bench/tcp_stream >/dev/null
echo "ship bench ($(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ))"

if [ "$agents" -gt 0 ] && [ "$(id -u)" = 0 ] && unshare -m --propagation private true 2>/dev/null; then
  mkdir -p "$base"
  for i in $(seq 1 "$reps"); do
    lib "$dir/ship_$i.so" "$i"; lib "$dir/priv_$i.so" $((i + 20)); lib "$base/base_$i.so" $((i + 50))
  done
  shared_agents "$agents"
  out=$(run "the real-agent run" $B/bin/monarch-run --hostfile "$dir/hosts" bench/ship.lua real "$dir" "$base" "$reps" ship)
  stop_agents
  private_agents "$agents"
  pout=$(run "the private-cache run" $B/bin/monarch-run --hostfile "$dir/hosts" bench/ship.lua real "$dir" "$base" "$reps" priv)
  stop_agents
  gbs=$($B/bench/tcp_stream "$mib" 5 | awk '{for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) v = $i} END {print v}')
  send_ms=$(echo "$mib * 1048576 / ($gbs * 1000000000) * 1000" | bc -l)
  loc=$(get local_ms "$out") first=$(get first_ms "$out") loc2=$(get local2_ms "$out") second=$(get second_ms "$out")
  echo
  echo "1. a $(get lib_bytes "$out")-byte library to $agents real agents sharing one cache (one machine's agents), medians of $reps"
  printf '%-44s %10.1f ms\n' "local-path load (the baseline)" "$loc"
  printf '%-44s %10.1f ms  (%s GB/s)\n' "one loopback send of the bytes (tcp_stream)" "$send_ms" "$gbs"
  printf '%-44s %10.1f ms  %.2fx of local + send (target <= 1.5x); controller wrote %s copies\n' \
    "first load, shipped" "$first" "$(echo "$first / ($loc + $send_ms)" | bc -l)" "$(get ctl_copies "$out")"
  printf '%-44s %10.1f ms\n' "local-path load on a second mesh" "$loc2"
  printf '%-44s %10.1f ms  %.2fx of local (target <= 1.10x)\n' "second load, from the hosts' caches" "$second" \
    "$(echo "$second / $loc2" | bc -l)"
  printf '%-44s %10.1f ms  (the controller hashing the file: its share of the first load)\n' "controller's hash of the file" \
    "$(get hash_ms "$out")"
  ploc=$(get local_ms "$pout") pfirst=$(get first_ms "$pout")
  echo "   the same with a private cache per agent (own mount namespace each: $agents copies hashed and stored on $(nproc) cores)"
  printf '%-44s %10.1f ms\n' "local-path load (the baseline)" "$ploc"
  printf '%-44s %10.1f ms  %.2fx of local + send; controller wrote %s copies\n' "first load, shipped" "$pfirst" \
    "$(echo "$pfirst / ($ploc + $send_ms)" | bc -l)" "$(get ctl_copies "$pout")"
else
  echo "(parts 1 and 3 need root and unshare -m: skipped)"
fi

if [ "$sim_hosts" -gt 0 ]; then
  lib "$dir/sim.so" 7
  GROUP=${SIM_GROUP:-64} start_agents "$sim_hosts" --simulate
  out=$(run "the simulated run" $B/bin/monarch-run --hostfile "$dir/hosts" bench/ship.lua sim "$dir/sim.so")
  stop_agents
  echo
  echo "2. the same library to $sim_hosts simulated hosts (--simulate, ${SIM_GROUP:-64} to a process and its cache; cast tree, fan-out 16)"
  printf '%-44s %10s (target <= 16; without the tree: %s)\n' "copies the controller wrote" "$(get ctl_copies "$out")" "$sim_hosts"
  printf '%-44s %10.1f ms (target < 10000)\n' "first load" "$(get first_ms "$out")"
  printf '%-44s %10.1f ms\n' "second load (every host has it)" "$(get second_ms "$out")"
fi

if [ "$(id -u)" = 0 ] && [ "$sync_mib" -gt 0 ] && unshare -m --propagation private true 2>/dev/null; then
  mkdir -p "$dir/data"
  for i in $(seq 1 "$sync_mib"); do head -c 1048576 /dev/urandom >"$dir/data/part_$i.bin"; done
  head -c 1024 /dev/urandom >"$dir/data/small.txt"
  private_agents 1
  out=$(run "the sync run" $B/bin/monarch-run --hostfile "$dir/hosts" bench/ship.lua sync "$dir/data")
  stop_agents
  echo
  echo "3. hosts:sync of a $sync_mib MiB folder ($(get files "$out") files) to one host, then again after a 1 KiB file changed"
  printf '%-44s %12s bytes %8.1f ms\n' "first sync (the baseline)" "$(get first_bytes "$out")" "$(get first_ms "$out")"
  printf '%-44s %12s bytes %8.1f ms  (target < 65536 bytes; %s file sent)\n' "second sync" "$(get second_bytes "$out")" \
    "$(get second_ms "$out")" "$(get second_shipped "$out")"
fi
