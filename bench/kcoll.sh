#!/usr/bin/env bash
# In-kernel all_reduce (kcoll's kc_bench: the loop runs inside the ranks, no
# controller round trip) against OpenMPI's MPI_Allreduce, measured in the same
# run with the same sizes, batches and formula (bench/mpi_allreduce.c).
#   bench/kcoll.sh [max_bytes] [repeats]
# Each figure is the median of `repeats` runs (default 3), ours and MPI's
# interleaved. Ratios: time ours/MPI (lower is better; the target is <= 1.5x
# at 1 KiB) and bus bandwidth ours/MPI (higher is better; >= 1.0x from 64 KiB).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
max=${1:-268435456}
reps=${2:-3}
[ -x "$B/bin/monarch-run" ] || { echo "bench/kcoll.sh: build first (make)"; exit 1; }
command -v mpicc >/dev/null && command -v mpirun >/dev/null ||
  { echo "bench/kcoll.sh: OpenMPI is missing (apt-get install -y openmpi-bin libopenmpi-dev)"; exit 1; }
export OPENBLAS_NUM_THREADS=1
mkdir -p "$B/bench"
mpicc -O2 -Wall -Wextra bench/mpi_allreduce.c -o "$B/bench/mpi_allreduce"
echo "in-kernel all_reduce vs OpenMPI ($(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)), median of $reps runs"
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
for r in $(seq 1 "$reps"); do
  "$B/bin/monarch-run" bench/kcoll.lua "$max" 2 4 >"$log/ours.$r"
  for n in 2 4; do
    mpirun --allow-run-as-root --oversubscribe -np "$n" "$B/bench/mpi_allreduce" "$max" 2>/dev/null
  done >"$log/mpi.$r"
done
med() { # kind procs bytes column
  cat "$log/$1".* | awk -v n="$2" -v b="$3" -v c="$4" '$1 == "allreduce" && $2 == n && $3 == b {print $c}' |
    sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "-"; else print v[int((NR + 1) / 2)]}'
}
ratio() { if [ "$1" = "-" ] || [ "$2" = "-" ]; then echo "-"; else echo "$1 $2" | awk '{printf "%.2fx", $1 / $2}'; fi; }
printf '\n%-6s %10s %11s %11s %9s %11s %11s %9s\n' procs bytes "ours us" "mpi us" time "ours GB/s" "mpi GB/s" busbw
for n in 2 4; do
  for b in $(awk '$1 == "allreduce" {print $3}' "$log/ours.1" | sort -un); do
    ot=$(med ours "$n" "$b" 4); mt=$(med mpi "$n" "$b" 4); ob=$(med ours "$n" "$b" 6); mb=$(med mpi "$n" "$b" 6)
    printf '%-6s %10s %11s %11s %9s %11s %11s %9s\n' "$n" "$b" "$ot" "$mt" "$(ratio "$ot" "$mt")" "$ob" "$mb" "$(ratio "$ob" "$mb")"
  done
done
