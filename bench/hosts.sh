#!/usr/bin/env bash
# all_reduce across two hosts with several procs each: by host (shared memory
# inside each host, a ring of one leader per host between them) against the
# flat ring over every proc (MONARCH_COLL_SHM=0), measured in the same run.
#   bench/hosts.sh [max_bytes] [repeats] [rate] [procs_per_host]
# The two hosts are this machine's network namespace and a second one,
# joined by a veth pair limited to RATE each way (tc tbf, default 2gbit), so
# traffic between them is bound by the link as between real machines while
# traffic inside a host is not. Each agent gets its own MONARCH_HOST_KEY
# (both namespaces share one kernel). Needs root and iproute2; prints why
# not otherwise. busbw in GB/s (nccl-tests formula), median of the repeats.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
max=${1:-67108864}
reps=${2:-3}
rate=${3:-2gbit}
per=${4:-2}
[ -x "$B/bin/monarch-run" ] || { echo "bench/hosts.sh: build first (make)"; exit 1; }
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "bench/hosts.sh: skipped: needs root, ip and tc (iproute2)"
  exit 0
fi
export OPENBLAS_NUM_THREADS=1
NS=mn_bench_b IF_A=mnbench0 IF_B=mnbench1 IP_A=10.77.92.1 IP_B=10.77.92.2
log=$(mktemp -d)
cleanup() {
  pkill -f "monarch-worker --listen $IP_A" 2>/dev/null || true
  ip netns pids "$NS" 2>/dev/null | xargs -r kill 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
  ip link del "$IF_A" 2>/dev/null || true
  rm -rf "$log"
}
trap cleanup EXIT
cleanup
log=$(mktemp -d)
ip netns add "$NS"
ip link add "$IF_A" type veth peer name "$IF_B"
ip link set "$IF_B" netns "$NS"
ip addr add "$IP_A/24" dev "$IF_A"
ip link set "$IF_A" up
ip netns exec "$NS" sh -c "ip addr add $IP_B/24 dev $IF_B && ip link set $IF_B up && ip link set lo up"
tc qdisc add dev "$IF_A" root tbf rate "$rate" burst 1mb latency 100ms
ip netns exec "$NS" tc qdisc add dev "$IF_B" root tbf rate "$rate" burst 1mb latency 100ms
echo "hosts bench ($(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)): 2 hosts x $per procs, link $rate each way, median of $reps"

run() { # out-file extra-env...
  local out=$1 tok="bench-$$-$RANDOM" pa pb
  shift
  env "$@" MONARCH_TOKEN="$tok" MONARCH_HOST_KEY=bench-a "$B/bin/monarch-worker" --listen "$IP_A:0" >"$log/a" 2>&1 &
  local a=$!
  ip netns exec "$NS" env "$@" MONARCH_TOKEN="$tok" MONARCH_HOST_KEY=bench-b "$B/bin/monarch-worker" \
    --listen "$IP_B:0" >"$log/b" 2>&1 &
  local b=$!
  for _ in $(seq 1 100); do
    pa=$(sed -n 's/.*listening on [0-9.]*:\([0-9]*\).*/\1/p' "$log/a" | head -1)
    pb=$(sed -n 's/.*listening on [0-9.]*:\([0-9]*\).*/\1/p' "$log/b" | head -1)
    [ -n "$pa" ] && [ -n "$pb" ] && break
    sleep 0.05
  done
  MONARCH_TOKEN="$tok" "$B/bin/monarch-run" --hosts "$IP_A:$pa,$IP_B:$pb" bench/allreduce.lua "$max" "per_host:$per" \
    >"$out" || echo "bench/hosts.sh: a run failed (see above)"
  kill "$a" 2>/dev/null || true
  ip netns exec "$NS" kill "$b" 2>/dev/null || kill "$b" 2>/dev/null || true
  wait "$a" "$b" 2>/dev/null || true
}
for r in $(seq 1 "$reps"); do
  run "$log/host.$r"
  run "$log/flat.$r" MONARCH_COLL_SHM=0
done

med() { # kind bytes
  cat "$log/$1".* 2>/dev/null | awk -v b="$2" '$1 == "allreduce" && $3 == b {print $6}' |
    sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "-"; else print v[int((NR + 1) / 2)]}'
}
n=$((2 * per))
printf '\n%-6s %10s %12s %12s %8s\n' procs bytes by-host flat-ring ratio
for b in $(awk '$1 == "allreduce" {print $3}' "$log/host.1" | sort -un); do
  h=$(med host "$b")
  f=$(med flat "$b")
  printf '%-6s %10s %12s %12s %8s\n' "$n" "$b" "$h" "$f" \
    "$(if [ "$h" = - ] || [ "$f" = - ]; then echo -; else echo "$h $f" | awk '{printf "%.2fx", $1 / $2}'; fi)"
done
