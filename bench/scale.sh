#!/usr/bin/env bash
# bench/scale.sh: mesh-wide call + gather, controller CPU and memory, as the
# mesh grows: real procs on local host agents (AGENTS x PER procs).
#   bench/scale.sh [AGENTS [PER [CALLS]]]     (default 32 x 32 = 1,024 procs)
# Every agent and proc is a real process on real TCP on this machine, so the
# latencies include the procs' own CPU time on its cores; the controller's
# CPU per call is its own (from /proc/self/stat).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
agents=${1:-32} per=${2:-32} calls=${3:-40}
export MONARCH_TOKEN=${MONARCH_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
dir=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
. bench/agents.sh
start_agents "$agents"
echo "scale bench ($(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)): $agents agents x $per procs"
# Before: the controller PINGs every proc and writes every call to every proc
# (MONARCH_PROC_HEARTBEAT=1 MONARCH_RELAY=0). Now: it PINGs the agents only
# (each watches its procs' status lines), and a mesh-wide call goes to each
# agent as one CAST frame, answered by one batched RESULTS frame.
before=$(MONARCH_PROC_HEARTBEAT=1 MONARCH_RELAY=0 $B/bin/monarch-run --hostfile "$dir/hosts" bench/scale.lua "$per" "$calls")
now=$($B/bin/monarch-run --hostfile "$dir/hosts" bench/scale.lua "$per" "$calls")
get() { echo "$2" | awk -v k="$1" '$1 == k {print $2}'; }
printf '%-40s %16s %16s %8s\n' "measure" "per proc" "through agents" "ratio"
for k in spawn_connect_s call_gather_ms ctl_cpu_per_call_ms ctl_idle_cpu_pct ctl_peak_rss_mib ctl_open_fds; do
  b=$(get $k "$before") n=$(get $k "$now")
  printf '%-40s %16s %16s %7.2fx\n' "$k" "$b" "$n" "$(echo "$n / $b" | bc -l)"
done
