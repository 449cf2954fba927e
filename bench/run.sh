#!/usr/bin/env bash
# make bench: every figure measured in this one run, next to its baseline.
# Medians of several batches; these machines are noisy, so compare ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
mode=${1:-full}
echo "monarch bench ($(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ))"
base=$($B/bench/tcp_pingpong 20000 40 | awk '/tcp_rtt_us/ {print $2}')
out=$($B/bin/monarch-run bench/core.lua $([ "$mode" = quick ] && echo quick))
get() { echo "$out" | awk -v k="$1" '$1 == k {print $2}'; }
rtt=$(get call_one_rtt_us); rate=$(get pipelined_calls_per_s); g8=$(get gather8_us)
printf '\n%-44s %14s %12s\n' "measure" "value" "vs baseline"
printf '%-44s %11.1f us %12s\n' "raw C TCP ping-pong round trip (baseline)" "$base" "1.00x"
printf '%-44s %11.1f us %11.2fx\n' "call_one(\"noop\"):get() round trip" "$rtt" "$(echo "$rtt / $base" | bc -l)"
printf '%-44s %11.0f /s %12s\n' "pipelined no-op calls to one proc" "$rate" "target 200000"
printf '%-44s %11.1f us %11.2fx\n' "call(\"noop\") + gather on 8 procs" "$g8" "$(echo "$g8 / $base" | bc -l)"
