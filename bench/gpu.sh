#!/usr/bin/env bash
# bench/gpu.sh - GPU figures next to their bare-CUDA baselines, measured in
# the same run on the same GPU; sized to finish in well under 5 minutes on
# one H200 (about a minute with the build).
#
#   dispatch  call_one("noop") of cuda_basic (one empty kernel launch + sync)
#             on a GPU proc, round trip from the controller, against the same
#             launch + cudaStreamSynchronize in a bare CUDA program
#             (build/bench/gpu_dispatch)
#   NCCL      gpu_all_reduce (f32 sum, in place), 1 MiB to 1 GiB, against a
#             bare ncclAllReduce + sync of the same size. ONE rank: NCCL allows
#             one rank per GPU, so one GPU gives a communicator of one. The
#             nccl-tests bus bandwidth, algbw x 2(n-1)/n, is 0 for n = 1 by
#             definition; it is printed for the record, and algbw (bytes / time
#             per call) is the figure to compare.
#
# Usage:
#   bench/gpu.sh            set up (build what is missing), then measure
#   bench/gpu.sh bench      measure only (after a setup)
#   . bench/gpu.sh env      (sourced) set up only: builds, exports PATH,
#                           LD_LIBRARY_PATH, MONARCH_* and BUSTED for the caller
# Setup builds with the repo's Makefile where the host build dependencies are
# installed (`make`), and otherwise uses a build/ carried from another machine
# (bench/gpu_check.sh --bundle makes one) and rebuilds only its CUDA parts
# here with `make -f mk/cuda.mk`. Exits non-zero on any failure.

gpu_find_lib() { # name -> prints the directory holding it, if the loader would not find it
  local name=$1 d
  if ldconfig -p 2>/dev/null | grep -q "[[:space:]]$name "; then return 0; fi
  for d in ${CUDA_HOME:-/usr/local/cuda}/lib64 /usr/local/cuda/lib64 /usr/local/cuda/lib; do
    if [ -e "$d/$name" ]; then echo "$d"; return 0; fi
  done
  d=$(find /usr /opt -maxdepth 10 -name "$name" 2>/dev/null | head -1)
  if [ -n "$d" ]; then dirname "$d"; fi
  return 0
}

gpu_env() {
  local root bundle extra="" d lib
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  cd "$root" || return 1
  B=${BUILD:-build}
  bundle=$root/$B/gpu-bundle
  export MONARCH_PREFIX=$root/$B MONARCH_BUILD=$B OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
  # Every rank here is on this host: NCCL's bootstrap needs no other interface.
  export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
  # The CUDA libraries the procs dlopen and cuda_basic links: the toolkit's, or
  # wherever pip put them (beside PyTorch) when the toolkit lacks one.
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    d=$(gpu_find_lib "$lib")
    if [ -n "$d" ]; then
      case ":$extra:" in *":$d:"*) ;; *) extra="$extra:$d" ;; esac
    fi
  done
  export LD_LIBRARY_PATH="${extra#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local native=0
  if pkg-config --exists luajit libuv msgpack libsodium openblas 2>/dev/null; then
    echo "gpu.sh: building with make"
    if timeout 300 make -j"$(nproc)" all >/tmp/monarch-gpu-build.log 2>&1; then
      native=1
      timeout 120 make -j"$(nproc)" tests >>/tmp/monarch-gpu-build.log 2>&1 ||
        echo "gpu.sh: warning: the C tests did not build (cmocka?)"
    else
      tail -40 /tmp/monarch-gpu-build.log
      echo "gpu.sh: make failed; trying the carried $B/"
    fi
  fi
  if [ "$native" = 0 ]; then
    if [ ! -x "$B/bin/monarch-worker" ]; then
      echo "gpu.sh: no usable build: the host build dependencies are missing (or make failed) and there is" \
        "no carried $B/ (make one with bench/gpu_check.sh --bundle)"
      return 1
    fi
    echo "gpu.sh: using the carried $B/, rebuilding its CUDA parts here"
    if command -v nvcc >/dev/null 2>&1; then
      timeout 240 make -B -f mk/cuda.mk cuda >/tmp/monarch-gpu-build.log 2>&1 ||
        { tail -20 /tmp/monarch-gpu-build.log; echo "gpu.sh: warning: CUDA rebuild failed; using the carried CUDA parts"; }
    fi
    if [ -d "$bundle/lib" ]; then export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
  fi
  command -v luajit >/dev/null 2>&1 || export PATH="$bundle/bin:$PATH"
  if command -v busted >/dev/null 2>&1; then
    BUSTED=busted
  else
    BUSTED="luajit $bundle/bin/busted.lua"
    export LUA_PATH="$bundle/share/lua/5.1/?.lua;$bundle/share/lua/5.1/?/init.lua;;"
    export LUA_CPATH="$bundle/lib/lua/5.1/?.so;;"
  fi
  export BUSTED
  for f in "$B/bin/monarch-worker" "$B/lib/monarch/lua/monarch/core.so" "$B/lib/monarch/cuda_basic.so" \
      "$B/bench/gpu_dispatch"; do
    [ -e "$f" ] || { echo "gpu.sh: $f is missing (is the CUDA toolkit installed?)"; return 1; }
    if ldd "$f" | grep -q "not found"; then
      echo "gpu.sh: $f cannot load:"; ldd "$f" | grep "not found"; return 1
    fi
  done
  command -v luajit >/dev/null 2>&1 || { echo "gpu.sh: no luajit here and none in $bundle"; return 1; }
  return 0
}

gpu_bench() {
  local lo=$((1 << 20)) hi=$((1 << 30)) out base script
  echo "== monarch GPU bench ($(date -u +%Y-%m-%dT%H:%MZ))"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader ||
    { echo "gpu.sh: nvidia-smi failed"; return 1; }
  base=$("$B/bench/gpu_dispatch" 5000 "$lo" "$hi") || { echo "gpu.sh: gpu_dispatch failed"; return 1; }
  script=$(mktemp /tmp/monarch-gpu-bench.XXXXXX.lua)
  cat >"$script" <<'LUA'
local root, build, lo, hi = arg[1], arg[2], tonumber(arg[3]), tonumber(arg[4])
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = root .. "/" .. build .. "/lib/monarch/lua/?.so;" .. package.cpath
local monarch = require "monarch"
local gpu = require "monarch.gpu"

local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2
end

local hosts = monarch.hosts()
local g = hosts:spawn_procs{ procs = 1 }
local info, why = gpu.info(g)
if not info then error("no GPU on the proc: " .. tostring(why), 0) end
print("gpu_name " .. info.name:gsub(" ", "_"))
g:load "cuda_basic"

-- Dispatch: call_one("noop") round trips; cuda_basic's noop launches and syncs an empty kernel.
local function rtt(m, batches, per)
  for _ = 1, 500 do m:call_one("noop"):get() end
  local xs = {}
  for b = 1, batches do
    local t0 = monarch.now()
    for _ = 1, per do m:call_one("noop"):get() end
    xs[b] = (monarch.now() - t0) / per * 1e6
  end
  return median(xs)
end
print(string.format("gpu_noop_rtt_us %.2f", rtt(g, 10, 1000)))
local c = hosts:spawn_procs{ procs = 1 }
if pcall(c.load, c, "basic") then -- basic needs OpenBLAS, which a carried build may lack here
  print(string.format("cpu_noop_rtt_us %.2f", rtt(c, 10, 1000)))
end
c:stop()

-- NCCL all_reduce on one rank, in place, pipelined: calls to one proc run in order.
local bytes = lo
while bytes <= hi do
  local t = g:gpu_tensor("f32", { bytes / 4 })
  g:call("fill", t, 1):get()
  for _ = 1, 2 do g:gpu_all_reduce(t, "sum"):get() end
  local iters = math.max(5, math.min(200, math.floor(8 * 2 ^ 30 / bytes)))
  local xs = {}
  for b = 1, 5 do
    local t0, futs = monarch.now(), {}
    for i = 1, iters do futs[i] = g:gpu_all_reduce(t, "sum") end
    for i = 1, iters do futs[i]:get() end
    xs[b] = (monarch.now() - t0) / iters * 1e6
  end
  local us = median(xs)
  print(string.format("allreduce %d %.2f %.2f", bytes, us, bytes / us / 1e3))
  t:free()
  bytes = bytes * 2
end
g:stop()
monarch.shutdown()
LUA
  out=$(luajit "$script" "$PWD" "$B" "$lo" "$hi") || { rm -f "$script"; echo "gpu.sh: the monarch bench failed"; return 1; }
  rm -f "$script"
  get() { echo "$1" | awk -v k="$2" '$1 == k {print $2}'; }
  calc() { awk "BEGIN { printf \"%.4f\", $1 }"; }
  local bare mon cpu
  bare=$(get "$base" launch_sync_us) mon=$(get "$out" gpu_noop_rtt_us) cpu=$(get "$out" cpu_noop_rtt_us)
  echo "device: $(echo "$base" | sed -n 's/^device //p'); $(echo "$base" | grep nccl_version || echo "no NCCL for the bare baseline")"
  printf '\n%-58s %10s %12s\n' "dispatch" "value" "vs bare"
  printf '%-58s %7.1f us %12s\n' "bare: empty kernel launch + cudaStreamSynchronize" "$bare" "1.00x"
  printf '%-58s %7.1f us %11.2fx\n' "monarch: call_one(\"noop\") of cuda_basic on a GPU proc" "$mon" "$(calc "$mon / $bare")"
  printf '%-58s %7.1f us\n' "  overhead over bare (controller round trip)" "$(calc "$mon - $bare")"
  if [ -n "$cpu" ]; then
    printf '%-58s %7.1f us\n' "  for reference: call_one(\"noop\") of basic on a CPU proc" "$cpu"
  fi
  printf '\nNCCL all_reduce, f32 sum in place, 1 rank on 1 GPU (busbw = algbw x 2(n-1)/n = 0 for n = 1)\n'
  printf '%10s %12s %12s %8s %12s %12s %8s\n' "bytes" "monarch us" "algbw GB/s" "busbw" "bare us" "algbw GB/s" "ratio"
  echo "$out" | awk '$1 == "allreduce" {print $2, $3, $4}' | while read -r n us bw; do
    local b_us b_bw
    b_us=$(echo "$base" | awk -v n="$n" '$1 == "nccl" && $2 == n {print $3}')
    b_bw=$(echo "$base" | awk -v n="$n" '$1 == "nccl" && $2 == n {print $4}')
    if [ -n "$b_us" ]; then
      printf '%10d %12.1f %12.2f %8.2f %12.1f %12.2f %7.2fx\n' "$n" "$us" "$bw" 0 "$b_us" "$b_bw" "$(calc "$bw / $b_bw")"
    else
      printf '%10d %12.1f %12.2f %8.2f %12s %12s %8s\n' "$n" "$us" "$bw" 0 "-" "-" "-"
    fi
  done
  echo "$out" | grep -q '^allreduce' || { echo "gpu.sh: no all_reduce figures"; return 1; }
  return 0
}

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  # Sourced: set up only, for the caller (bench/gpu_check.sh).
  [ "${1:-}" = env ] && gpu_env
else
  set -euo pipefail
  case "${1:-}" in
  bench) cd "$(dirname "$0")/.." && B=${BUILD:-build} && gpu_bench ;;
  "") gpu_env && gpu_bench ;;
  *) echo "usage: bench/gpu.sh [bench]   (or source it with 'env')"; exit 2 ;;
  esac
fi
