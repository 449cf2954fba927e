#!/usr/bin/env bash
# bench/scale.sh: mesh-wide call + gather, controller CPU and memory, as the
# mesh grows, in one run:
#  1. real procs on local host agents (AGENTS x PER, default 32 x 32 = 1,024),
#     the old direct path (a CALL per proc, the controller PINGs every proc)
#     next to the new one (a CAST per host agent, agents watch their procs);
#  2. simulated hosts: `monarch-worker --simulate` agents whose procs are
#     virtual (emulated inside the agent, no process each), SIM_PER procs on
#     each of 1, 16, 256, 1,024 and 4,096 hosts, then (SIM_EXTRA, rows
#     HOSTSxPROCS[/FANOUT]) 4,096 hosts without the cast tree (fanout 0) and
#     the same 32,768 procs on 64 hosts: what costs per host and what per
#     proc. Every controller, cast and relay path is the production code over
#     real TCP; only the procs are pretend, so thousands of hosts fit here.
#   bench/scale.sh [AGENTS [PER [CALLS]]]
#   SIM_HOSTS="1 16 256 1024 4096" SIM_PER=8 SIM_EXTRA="4096x8/0 64x512" SIM_CALLS=8 REAL=1 bench/scale.sh
# SIM_HOSTS= and SIM_EXTRA= (empty) skip the simulated series, REAL=0 the real one. Every
# agent and proc runs on this machine, so latencies include their CPU on its
# cores; the controller's CPU per call is its own (getrusage). Exits non-zero
# with a message if a run fails; kills every process it started.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
agents=${1:-32} per=${2:-32} calls=${3:-40}
sim_hosts=${SIM_HOSTS-1 16 256 1024 4096} sim_per=${SIM_PER:-8} sim_calls=${SIM_CALLS:-8} sim_extra=${SIM_EXTRA-4096x8/0 64x512}
sim_group=${SIM_GROUP:-64}
rows=""
for h in $sim_hosts; do rows="$rows ${h}x$sim_per"; done
rows="$rows $sim_extra"
export MONARCH_TOKEN=${MONARCH_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}
export OPENBLAS_NUM_THREADS=1
dir=$(mktemp -d)
pids=()
stop_agents() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
# Every simulated host's packets share this machine's one loopback input queue (net.core.netdev_max_backlog,
# 1,000 packets by default: on a cluster, each host has its own). Thousands of agents' bursts overflow it,
# and the drops come back as TCP retransmissions, 200 ms and more each. Raised for the run where we may
# (root), put back at exit; BACKLOG=keep leaves it.
backlog_was=
raise_backlog() {
  local f=/proc/sys/net/core/netdev_max_backlog want=${BACKLOG:-65536}
  [ "$want" = keep ] || [ ! -w "$f" ] || [ "$(cat "$f")" -ge "$want" ] && return 0
  backlog_was=$(cat "$f")
  echo "$want" >"$f" && echo "(net.core.netdev_max_backlog $backlog_was -> $want for this run: one loopback queue carries every host)"
}
cleanup() {
  stop_agents
  rm -rf "$dir"
  [ -z "$backlog_was" ] || echo "$backlog_was" >/proc/sys/net/core/netdev_max_backlog
}
trap cleanup EXIT
. bench/agents.sh
get() { echo "$2" | awk -v k="$1" '$1 == k {print $2}'; }
# run NAME ARGS...: the controller on $dir/hosts; its output, or a clear failure.
run() {
  local name=$1 out
  shift
  if ! out=$("$@" 2>"$dir/err"); then
    echo "bench/scale.sh: $name failed: $(head -4 "$dir/err")" >&2
    exit 1
  fi
  echo "$out"
}
echo "scale bench ($(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ))"
raise_backlog

if [ "${REAL:-1}" != 0 ]; then
  start_agents "$agents"
  echo
  echo "real procs: $agents agents x $per procs ($((agents * per))), per-proc path vs through the agents"
  # Before: the controller PINGs every proc and writes every call to every proc
  # (MONARCH_PROC_HEARTBEAT=1 MONARCH_RELAY=0). Now: it PINGs the agents only
  # (each watches its procs' status lines), and a mesh-wide call goes to each
  # agent as one CAST frame, answered by one batched RESULTS frame.
  before=$(MONARCH_PROC_HEARTBEAT=1 MONARCH_RELAY=0 run "the per-proc run" \
    $B/bin/monarch-run --hostfile "$dir/hosts" bench/scale.lua "$per" "$calls")
  # Casts to every agent directly (fanout 0), then through the cast tree (past the default fanout of 16
  # agents the controller casts to a few top agents and they hand the call on to their children).
  flat=$(SCALE_FANOUT=0 run "the flat-cast run" $B/bin/monarch-run --hostfile "$dir/hosts" bench/scale.lua "$per" "$calls")
  now=$(run "the cast-tree run" $B/bin/monarch-run --hostfile "$dir/hosts" bench/scale.lua "$per" "$calls")
  stop_agents
  ratio() { if [ "$(echo "$2 > 0" | bc -l)" = 1 ]; then printf '%7.2fx' "$(echo "$1 / $2" | bc -l)"; else printf '%8s' "-"; fi; }
  printf '%-24s %12s %12s %12s %8s %8s\n' "measure" "per proc" "flat casts" "cast tree" "flat/" "tree/"
  for k in spawn_connect_s spawn_ctl_cpu_ms spawn_frames call_gather_ms ctl_cpu_per_call_ms ctl_bytes_per_proc ctl_rss_per_proc ctl_idle_cpu_pct \
    ctl_peak_rss_mib ctl_open_fds ctl_direct_links call_one_us; do
    b=$(get $k "$before") f=$(get $k "$flat") n=$(get $k "$now")
    printf '%-24s %12s %12s %12s %s %s\n' "$k" "$b" "$f" "$n" "$(ratio "$f" "$b")" "$(ratio "$n" "$b")"
  done
fi

if [ -n "${rows// /}" ]; then
  echo
  echo "simulated hosts (monarch-worker --simulate): hosts x procs each; $sim_calls calls per batch, median of 5 batches"
  fmt='%6s %7s %7s %9s %8s %13s %12s %15s %20s %19s %17s %17s %23s %10s\n'
  printf "$fmt" hosts procs fanout connect_s spawn_s spawn_cpu_ms spawn_frames call_gather_ms ctl_cpu_per_call_ms \
    ctl_bytes_per_proc ctl_rss_per_proc ctl_idle_cpu_pct agents_cpu_per_call_ms agent_kib
  for row in $rows; do
    h=${row%x*} p=${row#*x} f=
    case "$p" in */*) f=${p#*/} p=${p%/*} ;; esac
    case "$h$p$f" in *[!0-9]* | "") echo "bench/scale.sh: a simulated row is HOSTSxPROCS[/FANOUT], got '$row'" >&2; exit 2 ;; esac
    # Thousands of agents leave thousands of closed connections in TIME_WAIT for a minute; a row that
    # starts while they hold most of the ephemeral ports would measure failed connects instead.
    while command -v ss >/dev/null && [ "$(ss -Htan state time-wait | wc -l)" -gt 8000 ]; do sleep 2; done
    GROUP=$sim_group start_agents "$h" --simulate
    out=$(SCALE_FANOUT=$f run "the run on $h simulated hosts" $B/bin/monarch-run --hostfile "$dir/hosts" bench/scale.lua "$p" "$sim_calls")
    # One agent's own memory after the run (private pages, KiB): what each of the thousands costs the machine.
    # (pids[0] runs min(h, sim_group) agents: its memory over that many.)
    akib=$(awk -v n=$((h < sim_group ? h : sim_group)) '/^Private_(Clean|Dirty):/ {s += $2} END {printf "%d", s / n}' \
      "/proc/${pids[0]}/smaps_rollup" 2>/dev/null || echo "?")
    stop_agents
    printf "$fmt" "$h" "$(get procs "$out")" "${f:-default}" "$(get connect_s "$out")" "$(get spawn_connect_s "$out")" \
      "$(get spawn_ctl_cpu_ms "$out")" "$(get spawn_frames "$out")" "$(get call_gather_ms "$out")" "$(get ctl_cpu_per_call_ms "$out")" "$(get ctl_bytes_per_proc "$out")" \
      "$(get ctl_rss_per_proc "$out")" "$(get ctl_idle_cpu_pct "$out")" "$(get agents_cpu_per_call_ms "$out")" "$akib"
  done
  echo "spawn_s: spawn_procs + load \"basic\"; spawn_cpu_ms, spawn_frames: the controller's CPU in spawn_procs and the"
  echo "SPAWN frames it wrote (one per top agent through the tree); per proc, less the ValueMesh: ctl_bytes (Lua heap + malloc in use),"
  echo "ctl_rss (resident set grown: also what the collector freed); agents_cpu: every agent's CPU per call, the"
  echo "simulated procs' work included (all of it shares this machine's cores); agent_kib: one agent's private memory"
fi
