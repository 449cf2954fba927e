#!/usr/bin/env bash
# The Jupyter kernel (issue 31) against the REPL's way of running the same code,
# in the same run (bench/jupyter_driver.py; the baseline in blocks interleaved
# with the cells', medians of all samples):
#   - an empty cell's round trip, execute_request to execute_reply (target: median under 5 ms);
#   - a cell of procs:call("noop"):get() on 8 procs against the same call inside
#     monarch-run (bench/jupyter_baseline.lua) plus the empty cell (target: at most 1.1x);
#     the call back to back in monarch-run is the target's baseline; paced as cells come
#     (the loop idle for an empty cell's round trip before each call) shows how much of
#     the difference is the cadence; the call timed inside the cell by the kernel shows
#     what the kernel adds around it; a cell that spins in Lua as long as the call takes shows
#     what any cell of that length costs beyond the empty one, apart from how the kernel waits;
#     a cell that shows the call's value, kept from an earlier call, shows what its result
#     (one more iopub message, the ValueMesh as text and HTML) costs without the call;
#   - a cell printing 10,000 lines (target: under 1 s, every line received, in order).
# Needs python3-jupyter-client.
#   bench/jupyter.sh [rounds [blocks]]     (default 200 cells per figure, in 4 blocks)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
rounds=${1:-200}
blocks=${2:-4}
lines=10000
[ -x "$B/bin/monarch-run" ] || { echo "bench/jupyter.sh: build first (make)"; exit 1; }
py=/usr/bin/python3
[ -x $py ] || py=python3
$py -c "import jupyter_client" 2>/dev/null || { echo "bench/jupyter.sh: needs python3-jupyter-client"; exit 1; }
export OPENBLAS_NUM_THREADS=1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
out=$($py bench/jupyter_driver.py "$scratch" "$B/bin/monarch-run" "$rounds" "$lines" "$blocks" 2>"$scratch/driver.err") ||
  { cat "$scratch/driver.err" >&2; exit 1; }
get() { echo "$out" | sed -n "s/^$1 //p"; }
empty=$(get empty_ms) cell=$(get noop_cell_ms) tight=$(get base_tight_ms) paced=$(get base_paced_ms)
inside=$(get call_in_cell_ms)
ratio() { echo "($1) / ($2)" | bc -l; }
echo "jupyter kernel, $(get samples) cells per figure in $blocks blocks ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
printf "%-46s %10s %12s %8s\n" "" "figure" "baseline" "ratio"
printf "%-46s %8.3fms %10.3fms %7.2fx  (target < 1)\n" "empty cell round trip (median)" "$empty" 5 "$(ratio "$empty" 5)"
printf "%-46s %8.3fms %10.3fms %7.2fx  (target <= 1.1)\n" "noop on 8 procs: cell vs monarch-run + empty" "$cell" \
  "$(echo "$tight + $empty" | bc -l)" "$(ratio "$cell" "$tight + $empty")"
printf "%-46s %8.3fms %10.3fms %7.2fx\n" "  the same, the call paced as cells come" "$cell" \
  "$(echo "$paced + $empty" | bc -l)" "$(ratio "$cell" "$paced + $empty")"
printf "%-46s %8.3fms %10.3fms %7.2fx  (kernel's clock vs paced)\n" "  the call inside a cell vs paced in monarch-run" \
  "$inside" "$paced" "$(ratio "$inside" "$paced")"
printf "%-46s %8.3fms\n" "  the call back to back in monarch-run" "$tight"
spin=$(get spin_ms)
printf "%-46s %8.3fms %10.3fms %7.2fx  (control: no cluster, no wait)\n" "  a cell spinning ${spin} ms in Lua vs it + empty" \
  "$(get spin_cell_ms)" "$(echo "$spin + $empty" | bc -l)" "$(ratio "$(get spin_cell_ms)" "$spin + $empty")"
printf "%-46s %8.3fms %10.3fms %7.2fx  (control: its result message, no call)\n" \
  "  a cell showing the call's value vs empty" "$(get value_cell_ms)" "$empty" "$(ratio "$(get value_cell_ms)" "$empty")"
printf "%-46s %9.3fs %11.3fs %7.2fx  (target < 1)\n" "$lines printed lines, to the cell's idle" "$(get lines_s)" 1 \
  "$(get lines_s)"
echo "  lines received: $(get lines_received) of $lines, in order: $(get lines_in_order), in $(get lines_messages) stream messages"
