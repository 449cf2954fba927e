#!/usr/bin/env bash
# Runs the libFuzzer targets built by `make fuzz-build`, each for a bounded
# time, starting from the seed corpus in tests/fuzz/corpus/<target>.
#   tests/fuzz/run.sh [target...]        (default: all four)
# Environment: FUZZ_SECONDS (per target, default 30), FUZZ_BUILD (build-fuzz),
# FUZZ_JOBS (parallel workers per target, default 1), FUZZ_SKIP_OVERCOUNT=1
# (skip inputs that hit known issue F1, see fuzz_util.h).
# New inputs go to $FUZZ_BUILD/corpus/<target> (kept between runs, never
# committed); a crash leaves $FUZZ_BUILD/artifacts/<target>-crash-* and makes
# the script exit 1 after printing the reproducer command.
set -u
cd "$(dirname "$0")/../.."
B=${FUZZ_BUILD:-build-fuzz}
secs=${FUZZ_SECONDS:-30}
jobs=${FUZZ_JOBS:-1}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(fuzz_frame fuzz_handshake fuzz_join fuzz_exec)
# fuzz_exec loads basic.so from here; an instrumented one when `make fuzz-build` made it.
export MONARCH_PREFIX=${MONARCH_PREFIX:-$PWD/$B}
# Leaks fail the run; UBSan aborts (the objects are built with -fno-sanitize-recover).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
export OPENBLAS_NUM_THREADS=1

failed=0
printf '%-16s %10s %8s %8s %8s  %s\n' target execs exec/s corpus cov result
for t in "${targets[@]}"; do
  bin=$B/fuzz/$t
  if [ ! -x "$bin" ]; then
    echo "$t: $bin not built (make fuzz-build)"
    failed=1
    continue
  fi
  work=$B/corpus/$t art=$B/artifacts
  mkdir -p "$work" "$art"
  log=$B/$t.log
  # -timeout: one input may take at most 10 s; -rss_limit_mb: the whole process 2 GiB.
  par=()
  [ "$jobs" -gt 1 ] && par=(-jobs="$jobs" -workers="$jobs") # these write fuzz-N.log in the cwd
  "$bin" "$work" "tests/fuzz/corpus/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$art/$t-" "${par[@]}" >"$log" 2>&1
  rc=$?
  if [ "$jobs" -gt 1 ]; then cat fuzz-*.log >>"$log" 2>/dev/null; rm -f fuzz-*.log; fi
  execs=$(awk '/stat::number_of_executed_units/ {s += $2} END {print s + 0}' "$log")
  rate=$(awk '/stat::average_exec_per_sec/ {s += $2} END {print s + 0}' "$log")
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+')
  n=$(ls "$work" | wc -l)
  crash=$(grep -oE "Test unit written to [^ ]+" "$log" | head -1 | awk '{print $5}')
  if [ "$rc" -ne 0 ] || [ -n "$crash" ]; then
    result="FAILED (rc $rc)"
    failed=1
  else
    result=ok
  fi
  printf '%-16s %10s %8s %8s %8s  %s\n' "$t" "$execs" "$rate" "$n" "${cov:-?}" "$result"
  if [ "$result" != ok ]; then
    grep -E "ERROR|runtime error|check failed|SUMMARY" "$log" | head -5 | sed 's/^/    /'
    grep -E '^    #[0-9]+ ' "$log" | head -12
    [ -n "$crash" ] && echo "    reproduce: MONARCH_PREFIX=$MONARCH_PREFIX $bin $crash   (full log: $log)"
  fi
done
exit "$failed"
