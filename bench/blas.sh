#!/usr/bin/env bash
# One core's sgemm under each OpenBLAS core type, side by side, and
# examples/train.lua with MONARCH_BLAS_CORETYPE=off against auto (issue 34).
#   bench/blas.sh [train.lua steps]
# Each core type runs in its own probe process (monarch-worker --blas-probe
# CORE M N K: checked against a double reference, then timed, best of a few
# repeats; "crash" is a core whose kernels this CPU cannot run). Shapes: the
# MLP's (kernels/cpu/mlp.c at batch 32, hidden 128: the forward's and the
# backward's products, timed without their transposes) and a GPT layer's
# 2048x384x128. Ratio: to the best core type that passed its check; the
# target is OpenBLAS's own choice and auto within 10% of it. train.lua: the
# samples/s of each run, the ratio auto/off (target >= 1.4x where OpenBLAS
# picks a generic core) and whether the final weights' crc32 is the same.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
steps=${1:-1500}
W=$B/bin/monarch-worker
[ -x "$W" ] && [ -x "$B/bin/monarch-run" ] || { echo "bench/blas.sh: build first (make)"; exit 1; }
unset OPENBLAS_CORETYPE MONARCH_BLAS_CORETYPE
export OPENBLAS_NUM_THREADS=1
cores="- SKYLAKEX HASWELL COOPERLAKE"
shapes="32x128x64 32x10x128 128x10x32 32x128x10 64x128x32 2048x384x128"
grep -m1 "model name" /proc/cpuinfo | sed 's/.*: /cpu: /'
echo "OpenBLAS's own choice: $("$W" --blas-probe - 8 8 8 | sed 's/.*core=\([^ ]*\).*/\1/'); one thread; $(date -u +%Y-%m-%dT%H:%MZ)"
printf "%-14s" "MxNxK"
for c in $cores; do printf "%30s" "$([ "$c" = - ] && echo "own" || echo "$c")"; done
echo
for s in $shapes; do
  read -r m n k <<<"${s//x/ }"
  declare -A g=() name=()
  best=0
  for c in $cores; do
    line=$("$W" --blas-probe "$c" "$m" "$n" "$k" 2>/dev/null) || true
    if [[ $line == *ok=1* ]]; then
      g[$c]=$(sed 's/.*gflops=\([^ ]*\).*/\1/' <<<"$line")
      name[$c]=$(sed 's/.*core=\([^ ]*\).*/\1/' <<<"$line")
      best=$(awk -v a="$best" -v b="${g[$c]}" 'BEGIN {print (b > a) ? b : a}')
    elif [[ $line == *ok=0* ]]; then g[$c]=wrong
    else g[$c]=crash; fi
  done
  printf "%-14s" "$s"
  for c in $cores; do
    v=${g[$c]}
    if [[ $v == wrong || $v == crash ]]; then printf "%30s" "$v"
    else
      # OpenBLAS runs another core where the CPU lacks a forced one's instructions: it is named.
      other=$([ "$c" != - ] && [ "${name[$c],,}" != "${c,,}" ] && echo "=${name[$c]} " || true)
      printf "%30s" "$other$(awk -v v="$v" -v b="$best" 'BEGIN {printf "%.1f GF/s (%.2fx)", v, v / b}')"
    fi
  done
  echo
  unset g name
done
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
train() { # mode -> "samples/s crc32"
  local out
  out=$(MONARCH_BLAS_CORETYPE=$1 "$B/bin/monarch-run" examples/train.lua --device cpu --steps "$steps" --quiet \
    --every 0 --checkpoint-dir "$dir/ck" 2>&1) || { echo "train.lua failed: $out" >&2; exit 1; }
  echo "$(sed -n 's/.* \([0-9.]*\) samples\/s$/\1/p' <<<"$out" | tail -1) $(sed -n 's/.*crc32 \([0-9a-f]*\)).*/\1/p' <<<"$out")"
}
# Twice each, interleaved, the better of two kept: one run of a few seconds is noisy on a shared machine.
max() { awk -v a="$1" -v b="$2" 'BEGIN {print (b > a) ? b : a}'; }
read -r off_rate off_crc <<<"$(train off)"
read -r auto_rate auto_crc <<<"$(train auto)"
read -r r2 _ <<<"$(train off)"; off_rate=$(max "$off_rate" "$r2")
read -r r2 _ <<<"$(train auto)"; auto_rate=$(max "$auto_rate" "$r2")
echo "train.lua ($steps steps, 4 procs, best of 2): off $off_rate samples/s, auto $auto_rate samples/s:" \
  "$(awk -v a="$auto_rate" -v o="$off_rate" 'BEGIN {printf "%.2fx", a / o}');" \
  "weights $([ "$off_crc" = "$auto_crc" ] && echo "identical (crc32 $off_crc)" || echo "DIFFER ($off_crc vs $auto_crc)")"
