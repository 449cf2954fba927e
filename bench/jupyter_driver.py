#!/usr/bin/env python3
"""The Jupyter kernel's costs, measured as a front end sees them (jupyter_client),
with their baseline from the same run, for bench/jupyter.sh. The machine's load
drifts (2 cores shared), so the figures and the baseline are taken in BLOCKS
interleaved blocks and each is the median of all its samples:

  empty cells; the baseline (bench/jupyter_baseline.lua in monarch-run: the
  noop call back to back, and paced by the empty cell's round trip); noop
  cells (procs:call("noop"):get() on 8 procs, sent to execute_reply
  received); the same call timed inside the cell by the kernel's clock;
  and a control: cells that spin in Lua as long as the call takes back to
  back (no cluster, no wait in the loop), so what a cell of that length
  costs beyond the empty one shows apart from how the kernel waits.

Then a cell printing LINES lines (time to the reply and to the last line, and
whether every line came, in order). Prints "name value" lines.

  jupyter_driver.py SCRATCH MONARCH_RUN ROUNDS LINES [BLOCKS]
"""
import os
import statistics
import subprocess
import sys
import time

scratch, run, rounds, nlines = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
blocks = int(sys.argv[5]) if len(sys.argv) > 5 else 4
per_block = max(1, rounds // blocks)
subprocess.run([run, "--install-kernel", "--prefix", scratch], check=True, stdout=subprocess.DEVNULL)
os.environ["JUPYTER_PATH"] = os.path.join(scratch, "share", "jupyter")
from jupyter_client.manager import KernelManager  # noqa: E402

km = KernelManager(kernel_name="monarch")
km.start_kernel(stderr=open(os.path.join(scratch, "kernel.err"), "w"))
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=60)


def round_trip(code):
    t0 = time.perf_counter()
    msg_id = kc.execute(code)
    while True:
        r = kc.get_shell_msg(timeout=60)
        if r["parent_header"].get("msg_id") == msg_id:
            break
    t = time.perf_counter() - t0
    if r["content"]["status"] != "ok":
        sys.exit("cell failed: %r: %s" % (code, r["content"]))
    return t * 1e3


def cells(code, n):
    return [round_trip(code) for _ in range(n)]


def baseline(gap_ms):
    out = subprocess.run([run, "bench/jupyter_baseline.lua", str(per_block), "%.3f" % gap_ms],
                         check=True, capture_output=True, text=True).stdout
    got = {}
    for line in out.splitlines():
        name, *vals = line.split()
        got[name] = [float(v) for v in vals]
    return got["tight"], got["paced"]


NOOP = 'procs:call("noop"):get()'
TIMED = 'local t0 = monarch.now() local v = procs:call("noop"):get() bench_t[#bench_t + 1] = monarch.now() - t0 return v'
round_trip('procs = hosts:spawn_procs{procs = 8}; procs:load "basic"; bench_t = {}; '
           'bench_v = procs:call("noop"):get()')
for code in ("", NOOP, TIMED):  # warm: the JIT, the procs' connections
    cells(code, max(5, rounds // 10))
round_trip("bench_t = {}")
s = {"empty": [], "noop": [], "tight": [], "paced": [], "spin": [], "value": []}
spin_ms = None
for _ in range(blocks):
    s["empty"] += cells("", per_block)
    tight, paced = baseline(statistics.median(s["empty"]))
    s["tight"] += tight
    s["paced"] += paced
    spin_ms = spin_ms or statistics.median(tight)
    s["noop"] += cells(NOOP, per_block)
    cells(TIMED, per_block)
    s["value"] += cells("bench_v", per_block)  # the call's result shown, without the call
    s["spin"] += cells("local t = monarch.now() + %.6f while monarch.now() < t do end" % (spin_ms / 1e3), per_block)
out = []
kc.execute_interactive('print(table.concat(bench_t, " "))', timeout=60,
                       output_hook=lambda m: out.append(m["content"]["text"]) if m["msg_type"] == "stream" else None)
inside = [float(v) * 1e3 for v in "".join(out).split()]
print("empty_ms %.3f" % statistics.median(s["empty"]))
print("noop_cell_ms %.3f" % statistics.median(s["noop"]))
print("base_tight_ms %.3f" % statistics.median(s["tight"]))
print("base_paced_ms %.3f" % statistics.median(s["paced"]))
print("call_in_cell_ms %.3f" % statistics.median(inside))
print("spin_cell_ms %.3f" % statistics.median(s["spin"]))
print("spin_ms %.3f" % spin_ms)
print("value_cell_ms %.3f" % statistics.median(s["value"]))
print("samples %d" % len(s["noop"]))

# 10,000 lines: drain iopub first, then time the cell and collect its stream text.
while True:
    try:
        kc.get_iopub_msg(timeout=0.2)
    except Exception:
        break
t0 = time.perf_counter()
msg_id = kc.execute("for i = 1, %d do print(i) end" % nlines)
text, t_last, idle = [], None, False
deadline = time.time() + 60
while not idle and time.time() < deadline:
    m = kc.get_iopub_msg(timeout=60)
    if m["parent_header"].get("msg_id") != msg_id:
        continue
    if m["msg_type"] == "stream":
        text.append(m["content"]["text"])
        t_last = time.perf_counter() - t0
    elif m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
        idle = True
t_all = time.perf_counter() - t0
got = "".join(text).split("\n")[:-1]
in_order = got == [str(i) for i in range(1, nlines + 1)]
print("lines_s %.3f" % t_all)
print("lines_received %d" % len(got))
print("lines_in_order %s" % ("yes" if in_order else "no"))
print("lines_messages %d" % len(text))
kc.stop_channels()
km.shutdown_kernel(now=False)
