#!/usr/bin/env bash
# make bench: every figure measured in this one run, next to its baseline.
# Medians of several batches; these machines are noisy, so compare ratios.
#   bench/run.sh [quick]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
mode=${1:-full}
q=$([ "$mode" = quick ] && echo quick || true)
echo "monarch bench ($(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ))"
ratio() { echo "$1 / $2" | bc -l; }
base=$($B/bench/tcp_pingpong 20000 40 | awk '/tcp_rtt_us/ {print $2}')
base1=$(taskset -c 0 $B/bench/tcp_pingpong 20000 40 | awk '/tcp_rtt_us/ {print $2}')
out=$($B/bin/monarch-run bench/core.lua $q)
get() { echo "$2" | awk -v k="$1" '$1 == k {print $2}'; }
rtt=$(get call_one_rtt_us "$out"); rate=$(get pipelined_calls_per_s "$out"); g8=$(get gather8_us "$out")
# The same round trip with the sequence/ack machinery off (no unacked copies, no replay cache).
noack=$(MONARCH_NO_ACK=1 MONARCH_NO_REPLAY=1 $B/bin/monarch-run bench/core.lua $q)
rtt0=$(get call_one_rtt_us "$noack")
# Tracing (monarch.trace): the same round trip with it off and on, in alternating batches of one run.
trc=$($B/bin/monarch-run bench/trace.lua $q)
fail=$($B/bin/monarch-run bench/failures.lua $q 2>/dev/null)
printf '\n%-52s %14s %12s\n' "measure" "value" "vs baseline"
printf '%-52s %11.1f us %12s\n' "raw C TCP ping-pong round trip (baseline)" "$base" "1.00x"
printf '%-52s %11.1f us %12s\n' "raw C TCP ping-pong, both ends on one core" "$base1" ""
printf '%-52s %11.1f us %11.2fx\n' "call_one(\"noop\"):get() round trip" "$rtt" "$(ratio "$rtt" "$base")"
printf '%-52s %14s %11.2fx\n' "  ... against the one-core raw TCP" "" "$(ratio "$rtt" "$base1")"
printf '%-52s %11.0f /s %12s\n' "pipelined no-op calls to one proc" "$rate" "target 200000"
printf '%-52s %11.1f us %11.2fx\n' "call(\"noop\") + gather on 8 procs" "$g8" "$(ratio "$g8" "$base")"
printf '%-52s %11.1f us %11.2fx\n' "round trip without seq/ack machinery" "$rtt0" "$(ratio "$rtt0" "$base")"
printf '%-52s %13.1f%% %12s\n' "  cost of seq/ack + replay cache" "$(echo "($rtt - $rtt0) / $rtt0 * 100" | bc -l)" "target <10%"
printf '%-52s %11.1f us %12s\n' "no-op round trip, tracing off (bench/trace.lua)" "$(get trace_off_rtt_us "$trc")" "1.00x"
printf '%-52s %11.1f us %11.2fx\n' "  ... tracing on (monarch.trace), target <= 1.10x" "$(get trace_on_rtt_us "$trc")" "$(get trace_on_ratio "$trc")"
printf '%-52s %11.0f ns %12s\n' "pipelined no-op call, tracing off" "$(get trace_pipelined_off_ns "$trc")" ""
printf '%-52s %11.0f ns %12s\n' "  ... tracing on (what it adds per call)" "$(get trace_pipelined_on_ns "$trc")" ""
printf '%-52s %11.1f ms %12s\n' "kill -9 -> failure delivered to the script" "$(get kill_to_failure_ms "$fail")" ""
printf '%-52s %11.1f ms %12s\n' "kill -9 -> restarted proc serving again" "$(get kill_to_serving_ms "$fail")" ""
can=$($B/bin/monarch-run bench/cancel.lua $q 2>/dev/null)
printf '%-52s %11.2f ms %11.1fx\n' "next call after a timed-out sleep(5) (cancelled)" "$(get next_call_after_timeout_ms "$can")" "$(ratio "$(get next_call_after_timeout_ms "$can")" "$(get noop_rtt_ms "$can")")"
printf '%-52s %11.0f /s %11.2fx\n' "  no-op burst right after it (vs before it)" "$(get burst_after_timeout_calls_per_s "$can")" "$(ratio "$(get burst_after_timeout_calls_per_s "$can")" "$(get burst_calls_per_s "$can")")"
mib=$([ "$mode" = quick ] && echo 64 || echo 256)
stream=$($B/bench/tcp_stream "$mib" 5 | awk '/tcp_stream_gbs/ {print $2}')
bulk=$($B/bin/monarch-run bench/bulk.lua "$mib" 5)
tcp=$(MONARCH_BULK_LOCAL=0 $B/bin/monarch-run bench/bulk.lua "$mib" 5)
printf '%-52s %11.2f GB/s %10s\n' "memcpy, ${mib} MiB, in the bulk run (baseline)" "$(get memcpy_gbs "$bulk")" "1.00x"
printf '%-52s %11.2f GB/s %9.2fx\n' "tensor put, same host ($(get path "$bulk")), ${mib} MiB" "$(get put_gbs "$bulk")" "$(get put_ratio "$bulk")"
printf '%-52s %11.2f GB/s %9.2fx\n' "tensor fetch, same host ($(get path "$bulk")), ${mib} MiB" "$(get fetch_gbs "$bulk")" "$(get fetch_ratio "$bulk")"
printf '%-52s %16s %9.2fx\n' "  first put (the proc maps the source then)" "" "$(get first_put_ratio "$bulk")"
printf '%-52s %16s %9.2fx\n' "  first fetch, into a fresh HostTensor (new pages)" "" "$(get fresh_fetch_ratio "$bulk")"
printf '%-52s %11.2f GB/s %10s\n' "raw C TCP stream, ${mib} MiB (baseline)" "$stream" "1.00x"
printf '%-52s %11.2f GB/s %9.2fx\n' "tensor put over TCP (MONARCH_BULK_LOCAL=0), ${mib} MiB" "$(get put_gbs "$tcp")" "$(ratio "$(get put_gbs "$tcp")" "$stream")"
printf '%-52s %11.2f GB/s %9.2fx\n' "tensor fetch over TCP (MONARCH_BULK_LOCAL=0), ${mib} MiB" "$(get fetch_gbs "$tcp")" "$(ratio "$(get fetch_gbs "$tcp")" "$stream")"
act=$($B/bin/monarch-run bench/actors.lua $q 2>/dev/null || true)
printf '%-52s %11.1f us %12s\n' "actor endpoint round trip (same proc)" "$(get actor_rtt_us "$act")" ""
printf '%-52s %11.1f us %12s\n' "  kernel round trip in the same run" "$(get kernel_rtt_us "$act")" ""
printf '%-52s %11.0f /s %12s\n' "CartPole env steps across the mesh" "$(get env_steps_per_s_mesh "$act")" ""
# The collective tables: quick mode stops at 16 MiB with one repeat.
sizes=$([ "$mode" = quick ] && echo "16777216 1" || true)
for extra in bench/collective.sh bench/hosts.sh; do
  [ -x "$extra" ] && { echo; "$extra" $sizes || echo "$extra failed"; }
done
# A host lost mid-training: how soon train.lua steps again on the survivors.
echo
bench/elastic.sh "$([ "$mode" = quick ] && echo 1 || echo 5)" || echo "bench/elastic.sh failed"
bench/train.sh "$([ "$mode" = quick ] && echo 1 || echo 7)" || echo "bench/train.sh failed"
exit 0
