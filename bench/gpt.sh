#!/usr/bin/env bash
# examples/gpt.lua against PyTorch eager on the same model, batches and cores,
# and against the physical limit (one core's sgemm), all measured in this run.
#   bench/gpt.sh [repeats] [steps]
# Figures are medians of `repeats` runs (default 3), ours and torch's
# interleaved; each run trains `steps` steps (default 60) of the default model.
# Prints each figure beside its baseline and the ratio. Then the reference
# check: 200 steps from our initial weights, ours and torch's losses compared.
# PyTorch lives in a bench-only venv ($GPT_TORCH_VENV, default build/venv-torch,
# made here with pip when missing): never a runtime dependency.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
reps=${1:-3}
steps=${2:-60}
[ -x "$B/bin/monarch-run" ] || { echo "bench/gpt.sh: build first (make)"; exit 1; }
venv=${GPT_TORCH_VENV:-$B/venv-torch}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "bench/gpt.sh: installing PyTorch into $venv (bench only)"
  python3 -m venv "$venv" && "$venv/bin/pip" install -q torch numpy
fi
py=$venv/bin/python
export OPENBLAS_NUM_THREADS=1 MONARCH_KERNEL_DIR=${MONARCH_KERNEL_DIR:-$PWD/$B/lib/monarch}
L=4 H=4 C=128 T=64 BATCH=16
model="--layers $L --heads $H --width $C --context $T"
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
ours() { # name args...: tokens/s of one run (the library's samples/s: tokens, training time only)
  local name=$1; shift
  "$B/bin/monarch-run" examples/gpt.lua $model --steps "$steps" --warmup 10 --eval-every 100000 --every 0 \
    --eval-windows 8 "$@" >"$log/run" 2>&1 || { cat "$log/run"; exit 1; }
  sed -n 's/^done:.* \([0-9.]*\) samples\/s$/\1/p' "$log/run" >>"$log/$name"
  sed -n 's/.*memory per proc (params, grads, AdamW) \([0-9.]*\) MB.*/\1/p' "$log/run" >"$log/mem.$name"
}
torch() { # name batch-per-rank options...: --threads N, or --ddp N (DistributedDataParallel over gloo, 1 thread a rank)
  local name=$1 b=$2; shift 2
  "$py" bench/gpt_torch.py $model --batch "$b" "$@" --time 20 --weights "$log/w.bin" |
    awk '/tokens/ {print $3}' >>"$log/$name"
}
echo "GPT ($L layers, width $C, $H heads, context $T, batch $BATCH per rank; $(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)), median of $reps runs"
"$B/bin/monarch-run" examples/gpt.lua $model --tp 1 --steps 1 --every 0 --eval-windows 1 --quiet \
  --dump-init "$log/w.bin" >/dev/null
for r in $(seq 1 "$reps"); do
  "$B/bin/monarch-run" bench/gpt_sgemm.lua 512 | awk '{print $2}' >>"$log/sgemm"
  ours one --dp 1 --tp 1 --batch $BATCH
  torch t1 $BATCH --threads 1
  ours dp2 --dp 2 --tp 1 --batch $BATCH
  torch t2 $((2 * BATCH)) --threads 2
  torch ddp2 $BATCH --ddp 2
  ours tp2 --dp 1 --tp 2 --batch $BATCH
done
med() { sort -g "$log/$1" | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
ratio() { echo "$1 $2" | awk '{printf "%.2fx", $1 / $2}'; }
one=$(med one) dp2=$(med dp2) tp2=$(med tp2) t1=$(med t1) t2=$(med t2) ddp2=$(med ddp2) sg=$(med sgemm)
# Model FLOPs per token: 6 x matrix parameters (blocks and the tied output) + 12 L T C (attention, whole T x T).
fpt=$(awk -v L=$L -v C=$C -v T=$T 'BEGIN {print 6 * (12 * L * C * C + 256 * C) + 12 * L * T * C}')
mflops=$(awk -v a="$one" -v f="$fpt" 'BEGIN {printf "%.4g", a * f}')
printf '\n%-44s %12s %14s %8s %8s\n' figure ours baseline ratio target
printf '%-44s %12s %14s %8s %8s\n' "tokens/s, 1 proc vs torch 1 thread" "$one" "$t1" "$(ratio "$one" "$t1")" ">=1.0x"
printf '%-44s %12s %14s %8s %8s\n' "tokens/s, dp=2 vs torch 2 threads (batch 2B)" "$dp2" "$t2" "$(ratio "$dp2" "$t2")" ">=1.0x"
printf '%-44s %12s %14s %8s %8s\n' "tokens/s, dp=2 vs torch DDP gloo 2 procs" "$dp2" "$ddp2" "$(ratio "$dp2" "$ddp2")" ">=1.0x"
printf '%-44s %12s %14s %8s %8s\n' "model FLOP/s, 1 proc vs one core's sgemm" "$mflops" "$sg" "$(ratio "$mflops" "$sg")" ">=0.50x"
printf '%-44s %12s %14s %8s %8s\n' "tokens/s, dp=2 vs 1 proc" "$dp2" "$one" "$(ratio "$dp2" "$one")" ">=1.7x"
printf '%-44s %12s %14s %8s %8s\n' "tokens/s, tp=2 vs 1 proc" "$tp2" "$one" "$(ratio "$tp2" "$one")" ">=1.5x"
m1=$(cat "$log/mem.one") m2=$(cat "$log/mem.tp2")
printf '%-44s %12s %14s %8s %8s\n' "MB per proc (params+grads+AdamW), tp=2 vs 1" "$m2" "$m1" "$(ratio "$m2" "$m1")" "<=0.60x"
echo
echo "reference: 200 steps from our initial weights, same batches (bench/gpt_torch.py)"
"$B/bin/monarch-run" examples/gpt.lua $model --tp 1 --steps 200 --every 0 --eval-every 100000 --eval-windows 1 \
  --quiet --dump-init "$log/w200.bin" --csv "$log/ours.csv" >/dev/null
"$py" bench/gpt_torch.py $model --steps 200 --weights "$log/w200.bin" --compare "$log/ours.csv"
