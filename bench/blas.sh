#!/usr/bin/env bash
# One core's sgemm at our kernels' shapes under each OpenBLAS core type, side
# by side: OpenBLAS's own choice, our pick (what an agent starting now
# chooses) and the best core type that passes its self-check; then
# examples/train.lua with MONARCH_BLAS_CORETYPE=off against auto (issue 34).
#   bench/blas.sh [train.lua steps] [rounds]
# Each core type runs `monarch-worker --blas-probe CORE`, the probe agents
# use: the MLP's forward and backward products (kernels/cpu/mlp.c at batch
# 32, 64 features, 128 hidden, 10 classes) and a GPT layer's 2048x384x128
# and 2048x128x384^T, each checked against a double reference, then timed
# (best of a few repeats). Rounds (default 3) run every core type in turn,
# interleaved; a shape's figure is its median over the rounds. "crash": the
# CPU cannot run the core type's kernels; "wrong": it failed its check.
# Target: our pick within 10% of the best at each shape (pick/best >= 0.90).
# train.lua: samples/s of each mode, best of 2 runs interleaved, the ratio
# auto/off, and whether the final weights' crc32 is the same; then what
# share of a step the MLP's products take (from the per-shape figures), the
# most any core type can gain there.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
steps=${1:-1500}
rounds=${2:-3}
W=$B/bin/monarch-worker
[ -x "$W" ] && [ -x "$B/bin/monarch-run" ] || { echo "bench/blas.sh: build first (make)"; exit 1; }
unset OPENBLAS_CORETYPE MONARCH_BLAS_CORETYPE MONARCH_BLAS_PICKED MONARCH_BLAS_PROBE_CORRUPT
export OPENBLAS_NUM_THREADS=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export XDG_CACHE_HOME=$dir/cache # a fresh choice now, not one cached earlier
cores="- SKYLAKEX COOPERLAKE HASWELL ZEN SANDYBRIDGE"
# Our pick: what monarch-run (the same choice as an agent's) sets for itself; "-" where OpenBLAS's own stands.
pick=$("$B/bin/monarch-run" -e 'print(os.getenv("OPENBLAS_CORETYPE") or "-")')
own=$("$W" --blas-probe - 8 8 8 | sed -n 's/.*core=\([^ ]*\).*/\1/p')
echo "cpu: $(grep -m1 "model name" /proc/cpuinfo | sed 's/.*: //'); OpenBLAS $("$W" --blas-probe - 8 8 8 |
  sed -n 's/.*version=\([^ ]*\).*/\1/p'), its own choice $own; our pick: $pick; one thread; $rounds rounds;" \
  "$(date -u +%Y-%m-%dT%H:%MZ)"
for r in $(seq "$rounds"); do
  for c in $cores; do
    out=$("$W" --blas-probe "$c" 2>/dev/null) || true
    if [[ $out == *"core="* ]]; then
      name=$(sed -n 's/^blas core=\([^ ]*\).*/\1/p' <<<"$out")
      # OpenBLAS runs another core where it cannot run the one asked for: that one is measured already.
      if [ "$c" != - ] && [ "${name,,}" != "${c,,}" ]; then echo "$c other $name" >>"$dir/notes"; continue; fi
      sed -n 's/^blas shape=\([^ ]*\) op=\([a-z]*\) ok=\([01]\) gflops=\([0-9.]*\)$/\1_\2 \3 \4/p' <<<"$out" |
        while read -r s ok g; do echo "$c $s $([ "$ok" = 1 ] && echo "$g" || echo wrong)"; done >>"$dir/res"
    else
      echo "$c crash" >>"$dir/notes"
    fi
  done
done
awk -v cores="$cores" -v pick="$pick" -v notes="$dir/notes" '
  function median(list,   a, n, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  BEGIN { nc = split(cores, C, " "); while ((getline l < notes) > 0) { split(l, f, " "); note[f[1]] = f[2] == "crash" ? "crash" : "=" f[3] } }
  { if ($3 == "wrong") bad[$1, $2] = 1; else v[$1, $2] = v[$1, $2] " " $3; if (!($2 in seen)) { seen[$2] = 1; S[++ns] = $2 } }
  END {
    printf "%-18s", "MxNxK op"
    for (i = 1; i <= nc; i++) printf "%13s", C[i] == "-" ? "own" : C[i]
    printf "%10s%10s %s\n", "own/best", "pick/best", "best"
    for (k = 1; k <= ns; k++) {
      s = S[k]; best = 0; bn = "-"
      for (i = 1; i <= nc; i++) if ((C[i], s) in v) { m[i] = median(v[C[i], s]); if (m[i] > best) { best = m[i]; bn = C[i] } }
      x = s; sub("_", " ", x); printf "%-18s", x
      for (i = 1; i <= nc; i++) {
        c = C[i]
        if (c in note) printf "%13s", note[c]; else if ((c, s) in bad) printf "%13s", "wrong"
        else printf "%13.1f", m[i]
      }
      po = (("-", s) in v) ? m[1] / best : 0
      pp = 0; for (i = 1; i <= nc; i++) if (C[i] == pick && ((C[i], s) in v)) pp = m[i] / best
      printf "%9.2fx%9.2fx %s\n", po, pp, bn == "-" ? "own" : bn
      split(s, d, /[x_]/)
      if (d[1] <= 128) { # an MLP product: its time in a training step, own and pick
        fl = 2 * d[1] * d[2] * d[3] / 1e3; uo += po > 0 ? fl / m[1] : 0; up += pp > 0 ? fl / (pp * best) : 0
      }
      lo += log(po > 0 ? po : 1e-9); lp += log(pp > 0 ? pp : 1e-9)
    }
    printf "geometric mean over the shapes: own/best %.2fx, pick/best %.2fx (target: pick/best >= 0.90 at each shape)\n",
      exp(lo / ns), exp(lp / ns)
    printf "%.1f %.1f\n", uo, up > "'"$dir/mlp_us"'"
  }' "$dir/res"
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
echo "train.lua ($steps steps, 4 procs, best of 2): off ($own) $off_rate samples/s, auto ($pick) $auto_rate samples/s:" \
  "$(awk -v a="$auto_rate" -v o="$off_rate" 'BEGIN {printf "%.2fx", a / o}');" \
  "weights $([ "$off_crc" = "$auto_crc" ] && echo "identical (crc32 $off_crc)" || echo "DIFFER ($off_crc vs $auto_crc)")"
# How much of a training step the products are: the bound on what any core type can gain there.
read -r us_own us_pick <"$dir/mlp_us"
awk -v o="$us_own" -v p="$us_pick" -v r="$off_rate" 'BEGIN {
  step = 1e6 / (r / (32 * 4))
  printf "train.lua: a proc'"'"'s step (batch 32) takes %.0f us (off); its five MLP products %.1f us with OpenBLAS'"'"'s own," \
    " %.1f us with our pick: %.1f%% of the step, so at most %.2fx from the core type\n", step, o, p, 100 * o / step,
    step / (step - o + p) }'
