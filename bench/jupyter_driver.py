#!/usr/bin/env python3
"""The Jupyter kernel's costs, measured as a front end sees them (jupyter_client),
for bench/jupyter.sh. Prints "name value" lines: the empty cell's round trip
(execute_request sent to execute_reply received), a cell of one
procs:call("noop"):get() on 8 procs, and a cell printing LINES lines (time to
the reply and to the last line, and whether every line came, in order).

  jupyter_driver.py SCRATCH MONARCH_RUN ROUNDS LINES
"""
import os
import statistics
import subprocess
import sys
import time

scratch, run, rounds, nlines = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
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
    return t


def median_of(code):
    for _ in range(max(5, rounds // 10)):  # warm: the JIT, the procs' connections
        round_trip(code)
    return statistics.median(round_trip(code) for _ in range(rounds))


empty = median_of("")
round_trip('procs = hosts:spawn_procs{procs = 8}; procs:load "basic"')
noop = median_of('procs:call("noop"):get()')
print("empty_ms %.3f" % (empty * 1e3))
print("noop_cell_ms %.3f" % (noop * 1e3))

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
km.shutdown_kernel(now=False)
