#!/usr/bin/env bash
# bench/ray.sh: monarch-run --ray on a real local Ray cluster of 3 nodes (a
# head and two more, 1 CPU each; tests/support/ray_cluster.lua), RUNS runs
# of each, medians printed beside their baselines from the same session:
#   start  3 hosts x 2 procs and a first mesh-wide call, from process start to
#          the call's answer (the target) and to the process's exit:
#          --ray (tests/support/ray_job.lua)  vs  the same job on 3 agents started
#          by hand (their start timed too; target <= 1.2x)  vs  Ray's own actors
#          starting 6 workers and answering one call (bench/ray_actors.py; target <= 0.6x),
#          and Ray's own floor: a driver with one placement group and 1 (or 3, one
#          per node) trivial actors answering a call, the least any job through Ray waits
#   kill   a node's raylet killed (SIGKILL) under examples/train.lua: to
#          training stepping again on the survivors, beside the time Ray takes
#          to mark the node dead (target: ours under 2 s + Ray's)
# Needs ray importable by MONARCH_RAY_PYTHON (default /opt/monarch-ray/bin/python).
#   bench/ray.sh [RUNS [start|kill]]   (default 5 runs, both parts)
set -euo pipefail
cd "$(dirname "$0")/.."
export MONARCH_BUILD=${BUILD:-build} OPENBLAS_NUM_THREADS=1
exec luajit -e 'package.path = "tests/?.lua;bench/?.lua;" .. package.path' bench/ray.lua "${1:-5}" "${2:-all}"
