#!/usr/bin/env bash
# The Jupyter kernel (issue 31) against the REPL's way of running the same code,
# in the same run: an empty cell's round trip (target: median under 5 ms); a
# cell of procs:call("noop"):get() on 8 procs against the same call timed
# inside `monarch-run -e` plus the empty cell's cost (target: at most 1.1x);
# a cell printing 10,000 lines (target: under 1 s, every line received, in
# order). Medians of ROUNDS cells (default 200). Needs python3-jupyter-client.
#   bench/jupyter.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
rounds=${1:-200}
lines=10000
[ -x "$B/bin/monarch-run" ] || { echo "bench/jupyter.sh: build first (make)"; exit 1; }
py=/usr/bin/python3
[ -x $py ] || py=python3
$py -c "import jupyter_client" 2>/dev/null || { echo "bench/jupyter.sh: needs python3-jupyter-client"; exit 1; }
export OPENBLAS_NUM_THREADS=1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# The baseline: the same call, timed inside one monarch-run -e (no Jupyter in the way).
base=$("$B/bin/monarch-run" -e "
  local monarch = require 'monarch'
  local median = dofile('bench/stats.lua').median
  local procs = monarch.hosts():spawn_procs{procs = 8}
  procs:load 'basic'
  for _ = 1, math.max(5, math.floor($rounds / 10)) do procs:call('noop'):get() end
  local t = {}
  for i = 1, $rounds do
    local t0 = monarch.now()
    procs:call('noop'):get()
    t[i] = monarch.now() - t0
  end
  print(string.format('%.3f', median(t) * 1e3))")
out=$($py bench/jupyter_driver.py "$scratch" "$B/bin/monarch-run" "$rounds" "$lines")
get() { echo "$out" | sed -n "s/^$1 //p"; }
empty=$(get empty_ms) cell=$(get noop_cell_ms)
echo "jupyter kernel, $rounds cells each ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores)"
printf "%-44s %12s %14s %8s\n" "" "figure" "baseline" "ratio"
printf "%-44s %10.3fms %12.3fms %7.2fx  (target < 1)\n" "empty cell round trip (median)" "$empty" 5 \
  "$(echo "$empty / 5" | bc -l)"
printf "%-44s %10.3fms %12.3fms %7.2fx  (target <= 1.1)\n" "noop on 8 procs: cell vs -e + empty cell" "$cell" \
  "$(echo "$base + $empty" | bc -l)" "$(echo "$cell / ($base + $empty)" | bc -l)"
printf "%-44s %10.3fms %12s\n" "  (the call alone inside monarch-run -e)" "$base" ""
printf "%-44s %11.3fs %13.3fs %7.2fx  (target < 1)\n" "$lines printed lines, to the cell's idle" "$(get lines_s)" 1 \
  "$(get lines_s)"
echo "  lines received: $(get lines_received) of $lines, in order: $(get lines_in_order), in $(get lines_messages) stream messages"
