#!/usr/bin/env bash
# bench/gpu_check.sh - the one command for a machine with a GPU: build, the
# GPU layer's C tests, cuda_gpt against gpt (build/tests/gpt_cuda_check), the
# GPU specs (tests/integration/gpu_spec.lua), then bench/gpu.sh. Everything goes to stdout; each stage is time-boxed so the
# whole run stays under 8 minutes; the exit status is non-zero if any stage
# failed. Ends with one line "gpu_check: PASS" or "gpu_check: FAIL (stages)".
#
#   bench/gpu_check.sh            on the GPU machine
#   bench/gpu_check.sh --bundle   beforehand, on a machine with the build
#                                 dependencies: builds everything and packs
#                                 build/gpu-bundle (LuaJIT, busted and the
#                                 shared libraries the host binaries use), so
#                                 that a GPU machine without those packages
#                                 runs the check from the carried build/
set -uo pipefail
exec 2>&1
cd "$(dirname "$0")/.." || exit 1
B=${BUILD:-build}

SKIP_LIBS='^(linux-vdso|ld-linux|libc\.so|libm\.so|libgcc_s|libpthread|libdl\.so|librt\.so|libstdc\+\+|libcuda|libcudart|libcublas|libnccl)'

bundle() {
  local dir=$B/gpu-bundle f
  make -j"$(nproc)" all tests || return 1
  rm -rf "$dir"
  mkdir -p "$dir/bin" "$dir/lib/lua/5.1" "$dir/share/lua/5.1"
  cp -L "$(command -v luajit)" "$dir/bin/luajit" || return 1
  cp -L "$(command -v busted)" "$dir/bin/busted.lua" || return 1 # not on PATH as "busted": run with luajit
  cp -rL /usr/share/lua/5.1/. "$dir/share/lua/5.1/" || return 1
  cp -rL /usr/lib/x86_64-linux-gnu/lua/5.1/. "$dir/lib/lua/5.1/" || return 1
  # The shared libraries of everything that runs there, minus the system's and
  # CUDA's own. OpenBLAS (35 MB) goes too: mlp loads the digits for the GPU
  # training spec, and the GPU machine may not have it; the whole build/ stays
  # under the 64 MiB a device run carries.
  for f in "$B/bin/monarch-worker" "$B/lib/monarch/lua/monarch/core.so" "$B"/lib/monarch/*.so "$B"/tests/test_gpu "$B"/tests/gpt_cuda_check \
      "$dir/bin/luajit" $(find "$dir/lib/lua/5.1" -name '*.so'); do
    ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
  done | sort -u | while read -r name path; do
    echo "$name" | grep -Eq "$SKIP_LIBS" || cp -L "$path" "$dir/lib/$name"
  done
  echo "gpu_check: packed $dir ($(du -sh "$dir" | cut -f1); $B/ is $(du -sh "$B" | cut -f1)):"
  ls "$dir/lib"
  echo "carry '$B' to the GPU machine and run bench/gpu_check.sh there"
}

if [ "${1:-}" = --bundle ]; then
  bundle
  exit $?
fi

failed=""
t0=$(date +%s)
stage() { echo; echo "== $1 ($(($(date +%s) - t0)) s)"; }

stage "setup"
uname -srm
nvidia-smi -L || { echo "gpu_check: nvidia-smi finds no GPU"; failed="$failed nvidia-smi"; }
# shellcheck source=bench/gpu.sh
if ! . bench/gpu.sh env; then
  echo "gpu_check: FAIL (setup)"
  exit 1
fi
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
echo "busted: $BUSTED"

stage "C tests of the GPU layer (build/tests/test_gpu)"
if [ -x "$B/tests/test_gpu" ] && ! ldd "$B/tests/test_gpu" | grep -q "not found"; then
  timeout 60 "$B/tests/test_gpu" || failed="$failed test_gpu"
else
  echo "not built here (no cmocka); skipped"
fi

# Every layer and kernel of cuda_gpt (kernels/cuda/gpt_*.cu) against gpt's on the same inputs (docs/gpt.md, CUDA).
stage "cuda_gpt against gpt (build/tests/gpt_cuda_check)"
if [ -x "$B/tests/gpt_cuda_check" ]; then
  timeout 120 "$B/tests/gpt_cuda_check" || failed="$failed gpt_cuda_check"
else
  echo "not built here (it needs nvcc and OpenBLAS's pkg-config); skipped"
fi

# gpu_spec.lua includes cuda_basic's all_reduce_inplace: NCCL inside a kernel on a mesh:group{gpu = true}.
stage "GPU specs (tests/integration/gpu_spec.lua, in-kernel NCCL included)"
# shellcheck disable=SC2086
timeout 240 $BUSTED --run=integration -o utfTerminal tests/integration/gpu_spec.lua || failed="$failed gpu_spec"

stage "bench/gpu.sh"
timeout 200 bench/gpu.sh bench || failed="$failed bench"

stage "done"
sleep 1 # agents and procs exit right after their controller
if command -v pgrep >/dev/null && pgrep -f "$PWD/$B/bin/monarch-worker" >/dev/null; then
  echo "leftover worker processes:"
  pgrep -fa "$PWD/$B/bin/monarch-worker"
  failed="$failed leftovers"
fi
if [ -n "$failed" ]; then
  echo "gpu_check: FAIL ($failed )"
  exit 1
fi
echo "gpu_check: PASS"
