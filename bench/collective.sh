#!/usr/bin/env bash
# CPU all_reduce bus bandwidth, ours against OpenMPI's MPI_Allreduce, measured
# in the same run with the same sizes and formula (nccl-tests: algbw = bytes /
# time, busbw = algbw * 2(n-1)/n), and proc-to-proc copy bandwidth.
#   bench/collective.sh [max_bytes] [repeats]
# Columns: ours (same-host links copy directly between procs), ours with
# MONARCH_COLL_CMA=0 (every byte over TCP), MPI as Debian ships it, MPI held
# to TCP (--mca btl tcp,self), and the ratios ours/MPI. Each figure is the
# median of `repeats` runs (default 3), ours and MPI's interleaved, because
# small shared machines are noisy.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
max=${1:-268435456}
reps=${2:-3}
[ -x "$B/bin/monarch-run" ] || { echo "bench/collective.sh: build first (make)"; exit 1; }
export OPENBLAS_NUM_THREADS=1
echo "collective bench ($(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)), busbw in GB/s, median of $reps runs"

have_mpi=1
if ! command -v mpicc >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then
  have_mpi=0
  echo "note: OpenMPI is not installed (apt-get install -y openmpi-bin libopenmpi-dev): no baseline columns"
else
  mkdir -p "$B/bench"
  mpicc -O2 -Wall -Wextra bench/mpi_allreduce.c -o "$B/bench/mpi_allreduce"
fi
mpi() { # procs extra-args...
  local n=$1
  shift
  mpirun --allow-run-as-root --oversubscribe "$@" -np "$n" "$B/bench/mpi_allreduce" "$max" 2>/dev/null
}

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
for r in $(seq 1 "$reps"); do
  "$B/bin/monarch-run" bench/allreduce.lua "$max" 2 4 >"$log/ours.$r"
  MONARCH_COLL_CMA=0 "$B/bin/monarch-run" bench/allreduce.lua "$max" 2 4 >"$log/tcp.$r"
  if [ "$have_mpi" = 1 ]; then
    { mpi 2; mpi 4; } >"$log/mpi.$r"
    { mpi 2 --mca btl tcp,self; mpi 4 --mca btl tcp,self; } >"$log/mpitcp.$r"
  fi
done

# median busbw of one kind for (procs, bytes); "-" when absent
med() {
  cat "$log/$1".* 2>/dev/null | awk -v n="$2" -v b="$3" '$1 == "allreduce" && $2 == n && $3 == b {print $6}' |
    sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "-"; else print v[int((NR + 1) / 2)]}'
}
ratio() { if [ "$1" = "-" ] || [ "$2" = "-" ]; then echo "-"; else echo "$1 $2" | awk '{printf "%.2fx", $1 / $2}'; fi; }

printf '\n%-6s %10s %10s %10s %10s %10s %10s %12s\n' procs bytes ours ours-tcp mpi mpi-tcp ours/mpi "tcp/mpi-tcp"
for n in 2 4; do
  for b in $(awk '$1 == "allreduce" {print $3}' "$log/ours.1" | sort -un); do
    o=$(med ours "$n" "$b"); t=$(med tcp "$n" "$b"); m=$(med mpi "$n" "$b"); mt=$(med mpitcp "$n" "$b")
    printf '%-6s %10s %10s %10s %10s %10s %10s %12s\n' "$n" "$b" "$o" "$t" "$m" "$mt" "$(ratio "$o" "$m")" "$(ratio "$t" "$mt")"
  done
done
echo
echo "proc-to-proc copy (GB/s, median):"
for b in $(awk '$1 == "copy" {print $2}' "$log/ours.1"); do
  c=$(cat "$log"/ours.* | awk -v b="$b" '$1 == "copy" && $2 == b {print $4}' | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}')
  printf '  %10s bytes  %8s GB/s\n' "$b" "$c"
done
