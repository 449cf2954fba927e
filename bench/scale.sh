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
# (MONARCH_PROC_HEARTBEAT=1 MONARCH_RELAY=0). Casts: it PINGs the agents only
# (each watches its procs' status lines), and a mesh-wide call goes to each
# agent as one CAST frame, answered by one batched RESULTS frame (fanout 0: no
# tree). Tree: past 16 agents (the default fanout) it casts to the top 16 and
# they hand the call on to their children.
before=$(MONARCH_PROC_HEARTBEAT=1 MONARCH_RELAY=0 $B/bin/monarch-run --hostfile "$dir/hosts" bench/scale.lua "$per" "$calls")
flat=$(SCALE_FANOUT=0 $B/bin/monarch-run --hostfile "$dir/hosts" bench/scale.lua "$per" "$calls")
tree=$($B/bin/monarch-run --hostfile "$dir/hosts" bench/scale.lua "$per" "$calls")
get() { echo "$2" | awk -v k="$1" '$1 == k {print $2}'; }
ratio() { if [ "$(echo "$2 > 0" | bc -l)" = 1 ]; then printf '%7.2fx' "$(echo "$1 / $2" | bc -l)"; else printf '%8s' "-"; fi; }
printf '%-24s %12s %12s %12s %8s %8s\n' "measure" "per proc" "casts" "cast tree" "casts/" "tree/"
for k in spawn_connect_s call_gather_ms ctl_cpu_per_call_ms ctl_idle_cpu_pct ctl_peak_rss_mib ctl_open_fds; do
  b=$(get $k "$before") f=$(get $k "$flat") t=$(get $k "$tree")
  printf '%-24s %12s %12s %12s %s %s\n' "$k" "$b" "$f" "$t" "$(ratio "$f" "$b")" "$(ratio "$t" "$b")"
done
