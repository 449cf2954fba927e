#!/usr/bin/env bash
# bench/load.sh: the load test of bench/load.lua as a small table, to check
# that peak memory does not grow with the number of calls (backpressure).
#   bench/load.sh [calls...]          default: 1000000 10000000
# WINDOWS="4096 65536" runs each size under each runtime.window (default:
# the runtime's own, 65536). Not part of `make test`: the default sizes take
# about a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
sizes=("$@")
[ ${#sizes[@]} -eq 0 ] && sizes=(1000000 10000000)
windows=${WINDOWS:-65536}
get() { echo "$2" | awk -v k="$1" '$1 == k {print $2}'; }
echo "monarch load test ($(nproc) cores): no-op calls to one proc, futures dropped, every 100000th waited on"
printf '\n%8s %10s %8s %10s %10s %12s %12s\n' window calls seconds calls/s inflight ctl_peak_mb proc_peak_mb
for w in $windows; do
  first_ctl= first_proc=
  for n in "${sizes[@]}"; do
    out=$("$B/bin/monarch-run" bench/load.lua "$n" window="$w" quiet)
    ctl=$(get controller_peak_rss_mb "$out") proc=$(get proc_peak_rss_mb "$out")
    printf '%8s %10s %8s %10s %10s %12s %12s\n' "$w" "$n" "$(get seconds "$out")" "$(get calls_per_s "$out")" \
      "$(get max_inflight "$out")" "$ctl" "$proc"
    first_ctl=${first_ctl:-$ctl} first_proc=${first_proc:-$proc}
  done
  if [ ${#sizes[@]} -gt 1 ]; then
    printf '%8s peak RSS, largest vs smallest run: controller %.2fx, proc %.2fx (bounded: close to 1)\n' "" \
      "$(echo "$ctl / $first_ctl" | bc -l)" "$(echo "$proc / $first_proc" | bc -l)"
  fi
done
