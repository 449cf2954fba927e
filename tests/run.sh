#!/usr/bin/env bash
# The whole suite: C unit tests (cmocka), busted specs for the Lua library,
# integration specs against real monarch-worker processes, and the CLI specs.
# Every layer is bounded by a timeout. Ends with one line "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
B=${BUILD:-build}
case $B in /*) P=$B ;; *) P=$PWD/$B ;; esac
export MONARCH_PREFIX=$P MONARCH_BUILD=$B OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export MONARCH_KERNEL_DIR=$PWD/$B/lib/monarch # test_kernels: this build's libraries
# An ASan build (make test-asan): its Lua module needs the ASan runtime loaded
# first into plain luajit (busted), so busted runs with it preloaded and
# tests/support/helper.lua takes LD_PRELOAD out again, so that what the specs start
# does not inherit it (pgrep hangs under it). handle_segv=0: the specs expect
# a kernel's SIGSEGV to kill its proc with that signal.
asan=$(ldd "$B/lib/monarch/lua/monarch/core.so" 2>/dev/null | awk '/libasan/ {print $3}')
if [ -n "$asan" ]; then
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:handle_segv=0}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
fi
# Sanitizer reports in a layer's output count as failures (faulty.c's
# null store is deliberate: its segv kernel must crash).
san_reports() { grep -E 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$1" | grep -vc 'kernels/test/faulty.c'; }
passed=0 failed=0
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT

count_cmocka() { # file -> adds to totals
  local p f
  p=$(grep -oE '\[  PASSED  \] [0-9]+' "$1" | grep -oE '[0-9]+$' | tail -1)
  f=$(grep -oE '\[  FAILED  \] [0-9]+ test' "$1" | grep -oE '[0-9]+' | tail -1)
  echo "${p:-0} ${f:-0}"
}

echo "== layering (each layer compiles with only its own and lower include paths)"
if tests/layers.sh; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
echo "== limits (no source file over 800 lines, no C function over 80)"
if tests/limits.sh; then passed=$((passed + 1)); else failed=$((failed + 1)); fi

echo "== C unit tests (cmocka)"
for t in "$B"/tests/test_*; do
  [ -x "$t" ] || continue
  timeout 300 "$t" >"$log/c.out" 2>&1
  rc=$?
  read -r p f < <(count_cmocka "$log/c.out")
  f=$((f + $(san_reports "$log/c.out")))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi # crashed or timed out
  [ "$f" -gt 0 ] && cat "$log/c.out"
  printf '   %-28s %3d passed, %d failed\n' "$(basename "$t")" "$p" "$f"
  passed=$((passed + p)) failed=$((failed + f))
done

run_busted() { # name run-config
  echo "== $1"
  timeout "${3:-900}" env ${asan:+LD_PRELOAD=$asan} busted --run="$2" -o utfTerminal >"$log/b.out" 2>&1
  local rc=$? line s f e
  line=$(grep -E '[0-9]+ successes? / [0-9]+ failures? / [0-9]+ errors?' "$log/b.out" | tail -1 | sed 's/\x1b\[[0-9;]*m//g')
  s=$(echo "$line" | grep -oE '^[0-9]+') ; f=$(echo "$line" | grep -oE '[0-9]+ failure' | grep -oE '[0-9]+'); e=$(echo "$line" | grep -oE '[0-9]+ error' | grep -oE '[0-9]+')
  s=${s:-0} f=${f:-0} e=${e:-0}
  e=$((e + $(san_reports "$log/b.out")))
  if [ -z "$line" ] || { [ "$rc" -ne 0 ] && [ $((f + e)) -eq 0 ]; }; then e=$((e + 1)); echo "   busted did not finish (rc $rc)"; fi
  [ $((f + e)) -gt 0 ] && sed 's/\x1b\[[0-9;]*m//g' "$log/b.out" | grep -v '^[●◼✱+-]*$' | tail -60
  printf '   %-28s %3d passed, %d failed\n' "$2" "$s" $((f + e))
  passed=$((passed + s)) failed=$((failed + f + e))
}
run_busted "Lua library specs (busted, LuaJIT)" unit 300
run_busted "integration specs (real worker processes)" integration 1200

# Nothing may outlive the suite: every agent and proc must be gone.
sleep 0.5
left=$(pgrep -f "$PWD/$B/bin/monarch-worker" | wc -l)
if [ "$left" -ne 0 ]; then
  echo "== leftover worker processes:"; pgrep -fa "$PWD/$B/bin/monarch-worker"
  failed=$((failed + 1))
else
  passed=$((passed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
