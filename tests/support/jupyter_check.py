#!/usr/bin/env python3
"""The Jupyter kernel (monarch-run --jupyter-kernel) driven by jupyter_client, as a
front end drives it: the protocol's requests and a cell's output, display,
interrupts, restart and shutdown (jupyter_driver.py: the kernelspec, the kernel,
one line per check). Every wait is bounded.

  jupyter_check.py SCRATCH_DIR MONARCH_RUN [-- options for the kernel, e.g. --hosts H:P]
"""
import os
import queue
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jupyter_driver import (RUN_TIMEOUT, ERR, scratch, check, start, execute, of_type, expect,  # noqa: E402
                            wait_gone, finish)
from jupyter_driver import proc_pids as pids_of  # noqa: E402
from jupyter_client.session import Session  # noqa: E402

km, kc = start()


@check("kernel_info")
def _():
    c = kc.kernel_info(reply=True, timeout=10)["content"]
    expect(c["protocol_version"] == "5.3", c)
    expect(c["language_info"]["name"] == "lua" and c["implementation"] == "monarch", c)


@check("execute_result")
def _():
    r, out = execute(kc, "1 + 1")
    res = of_type(out, "execute_result")
    expect(r["status"] == "ok" and len(res) == 1 and res[0]["data"]["text/plain"] == "2", (r, out))
    expect(res[0]["execution_count"] == r["execution_count"], (r, res))
    r2, _ = execute(kc, "x = 41")
    expect(r2["execution_count"] == r["execution_count"] + 1, (r, r2))
    r3, out3 = execute(kc, "x + 1")
    expect(of_type(out3, "execute_result")[0]["data"]["text/plain"] == "42", out3)


@check("streams")
def _():
    r, out = execute(kc, 'print("one", 2) io.write("two\\n") io.stderr:write("three\\n")')
    st = of_type(out, "stream")
    text = {"stdout": "".join(s["text"] for s in st if s["name"] == "stdout"),
            "stderr": "".join(s["text"] for s in st if s["name"] == "stderr")}
    expect(text["stdout"] == "one\t2\ntwo\n" and text["stderr"] == "three\n", text)


@check("errors")
def _():
    r, out = execute(kc, 'error("boom")')
    e = of_type(out, "error")
    expect(r["status"] == "error" and r["evalue"] == "boom" and e and e[0]["traceback"][0] == "error: boom", (r, out))
    r, out = execute(kc, 'error(require("monarch.errors").new{kind = "timeout", message = "too late"})')
    expect(r["ename"] == "MonarchError" and r["evalue"] == "timeout: too late", r)
    r, _ = execute(kc, "x = = 1")
    expect(r["status"] == "error" and "expected" in r["evalue"], r)


PLOT = 'require("monarch.plot").svg{x = {values = {1, 2, 3}}, series = {{name = "loss", values = {3, 2, 1}}}}'


@check("display_data_svg")
def _():
    r, out = execute(kc, "display(%s)" % PLOT)
    d = of_type(out, "display_data")
    expect(r["status"] == "ok" and d and d[0]["data"]["image/svg+xml"].lstrip().startswith("<"), out)
    r, out = execute(kc, PLOT)
    res = of_type(out, "execute_result")
    expect(res and "image/svg+xml" in res[0]["data"], out)


@check("update_display_data")
def _():
    r, out = execute(kc, 'h = display("first") h:update("second")')
    d, u = of_type(out, "display_data"), of_type(out, "update_display_data")
    expect(d and u and u[0]["transient"]["display_id"] == d[0]["transient"]["display_id"], out)
    expect(u[0]["data"]["text/plain"] == "second", u)


@check("mesh_html")
def _():
    r, out = execute(kc, 'procs = hosts:spawn_procs{procs = 2}; procs:load "basic"')
    expect(r["status"] == "ok", (r, out))
    r, out = execute(kc, 'procs:call("rank"):get()')
    data = of_type(out, "execute_result")[0]["data"]
    expect("ValueMesh" in data["text/plain"] and "<table>" in data["text/html"], data)
    r, out = execute(kc, "procs")
    expect("<table>" in of_type(out, "execute_result")[0]["data"]["text/html"], out)


def interrupted_sleep(interrupt):
    """A 30 s remote sleep, stopped by interrupt(); then the same proc answers the next cell."""
    msg_id = kc.execute('procs:slice{procs = 0}:call_one("sleep", 30):get()')
    time.sleep(1)  # the call is sent and the proc sleeps (only a shorter wait would make this test weaker)
    t0 = time.time()
    interrupt()
    reply = kc.get_shell_msg(timeout=15)
    expect(reply["parent_header"]["msg_id"] == msg_id, reply)
    c = reply["content"]
    expect(c["status"] == "error" and "interrupted" in c["evalue"], c)
    took = time.time() - t0
    r, out = execute(kc, 'procs:slice{procs = 0}:call_one("rank"):get()', timeout=10)
    expect(r["status"] == "ok", (r, out))
    return took


@check("early_output")
def _():
    # A cell that waits must show busy, its input and its first line while it waits, not with its reply.
    msg_id = kc.execute('print("early") procs:slice{procs = 0}:call_one("sleep", 2):get() print("late")')
    seen, deadline = [], time.time() + 1.5
    while time.time() < deadline and not any(t == "stream" for t, _ in seen):
        try:
            m = kc.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            continue
        if m["parent_header"].get("msg_id") == msg_id:
            seen.append((m["msg_type"], m["content"]))
    types = [t for t, _ in seen]
    expect(types[:3] == ["status", "execute_input", "stream"] and seen[2][1]["text"] == "early\n", seen)
    reply = kc.get_shell_msg(timeout=RUN_TIMEOUT)
    expect(reply["parent_header"]["msg_id"] == msg_id and reply["content"]["status"] == "ok", reply)
    while True:  # the rest of the cell's messages, through its idle
        m = kc.get_iopub_msg(timeout=RUN_TIMEOUT)
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status" and \
                m["content"]["execution_state"] == "idle":
            break


@check("interrupt_request")
def _():
    interrupted_sleep(km.interrupt_kernel)  # interrupt_mode "message": interrupt_request on control


@check("interrupt_sigint")
def _():
    interrupted_sleep(lambda: os.kill(km.provisioner.process.pid, signal.SIGINT))


@check("second_interrupt")
def _():
    # The cell catches the first interrupt (its call is cancelled) and waits again; the second stops that wait.
    msg_id = kc.execute('local f = procs:slice{procs = 0}:call_one("sleep", 30)\n'
                        'local ok, e = pcall(f.get, f)\n'
                        'print("first: " .. tostring(e.kind))\n'
                        'procs:slice{procs = 1}:call_one("sleep", 30):get()')
    time.sleep(1)  # the call is sent and the proc sleeps
    km.interrupt_kernel()
    said, deadline = "", time.time() + 15
    while "first: interrupted" not in said and time.time() < deadline:
        m = kc.get_iopub_msg(timeout=15)
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
            said += m["content"]["text"]
    expect("first: interrupted" in said, "the first interrupt did not reach the cell: %r" % said)
    time.sleep(0.5)  # the cell waits again, on proc 1
    t0 = time.time()
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=15)
    expect(reply["parent_header"]["msg_id"] == msg_id, reply)
    c = reply["content"]
    expect(c["status"] == "error" and "interrupted" in c["evalue"], c)
    expect(time.time() - t0 < 10, "the second interrupt took %.1f s" % (time.time() - t0))
    # Both sleeps were cancelled on their procs: each answers the next cell.
    r, out = execute(kc, 'procs:slice{procs = 0}:call_one("rank"):get() procs:slice{procs = 1}:call_one("rank"):get() '
                     'return "both"', timeout=10)
    expect(r["status"] == "ok" and of_type(out, "execute_result")[0]["data"]["text/plain"] == "both", (r, out))


@check("top_in_place")
def _():
    msg_id = kc.execute("top()")
    seen = {"display_data": 0, "update_display_data": 0}
    deadline = time.time() + 20
    while time.time() < deadline and seen["update_display_data"] < 1:
        m = kc.get_iopub_msg(timeout=20)
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] in seen:
            seen[m["msg_type"]] += 1
            expect("<table>" in m["content"]["data"]["text/html"], m["content"])
    expect(seen["display_data"] == 1 and seen["update_display_data"] >= 1, seen)
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=15)
    expect(reply["content"]["status"] == "ok", reply["content"])


# examples/linreg.lua's model, smaller: the training library's smallest whole example.
LINREG = r"""
linreg = { name = "linreg", options = { { "lr", 0.1, "number", "learning rate" } }, figures = { { "loss", "%.2e" } },
  plan = function() return { steps_per_epoch = 50 } end,
  setup = function(job) local p = job.procs
    return { state = { w = p:tensor("f32", { 2, 1 }) },
      data = { X = p:tensor("f32", { 32, 2 }), y = p:tensor("f32", { 32, 1 }) },
      work = { r = p:tensor("f32", { 32, 1 }), g = p:tensor("f32", { 2, 1 }) } } end,
  load = function(job) local xs, ys = {}, {}
    for r = 1, job:world() do local x, y = {}, {}
      for i = 1, 32 do y[i] = 0 for j = 1, 2 do local v = math.sin(r * 32 + i * (j + 0.5)) x[(i - 1) * 2 + j] = v y[i] = y[i] + j * v end end
      xs[r], ys[r] = x, y end
    job.data.X:scatter(xs):get() job.data.y:scatter(ys):get() end,
  step = function(job) local p, w, x, k = job.procs, job.state.w, job.data, job.work
    p:call("sgemm", x.X, w, k.r) p:call("axpy", -1, x.y, k.r) p:call("sgemm", x.X, k.r, k.g, 1 / 32, 0, true)
    p:all_reduce(k.g, "avg") p:call("axpy", -job.opts.lr, k.g, w)
    local loss = 0 for _, v in ipairs(p:call("dot", k.r, k.r):get():values()) do loss = loss + v / 32 / job:world() end
    return { loss = loss, samples = 32 * job:world() } end }
"""


@check("train_curve_in_place")
def _():
    r, out = execute(kc, LINREG + 'job = train_live(linreg, {"--steps", "12", "--procs", "2", "--every", "0", "--quiet"}, 3)')
    expect(r["status"] == "ok", (r, [o for o in out if o[0] in ("error", "stream")]))
    d, u = of_type(out, "display_data"), of_type(out, "update_display_data")
    expect(len(d) == 1 and len(u) >= 3, "one display and at least 3 updates, got %d and %d" % (len(d), len(u)))
    ids = {x["transient"]["display_id"] for x in u}
    expect(ids == {d[0]["transient"]["display_id"]}, (d, ids))
    svgs = [x["data"].get("image/svg+xml", "") for x in u]
    expect(all(x.lstrip().startswith("<") and "loss" in x for x in svgs), svgs[0][:200])
    points = [len(re.search(r'data-name="loss"[^>]*points="([^"]*)"', x).group(1).split()) for x in svgs]
    expect(points == sorted(points) and points[0] < points[-1] == 12, "steps drawn: %r" % points)  # growing, all 12
    text = "".join(s["text"] for s in of_type(out, "stream"))
    expect("done: 12 steps" in text, text)
    r, out = execute(kc, 'train_live(linreg, {"--bogus"})')
    expect(r["status"] == "error" and "train_live: unknown argument '--bogus'" in r["evalue"], r)
    r, out = execute(kc, "job.total")
    expect(of_type(out, "execute_result")[0]["data"]["text/plain"] == "12", out)  # the kernel lives on


@check("complete")
def _():
    c = kc.complete("procs:ca", 8, reply=True, timeout=10)["content"]
    expect("procs:call" in c["matches"] and "procs:call_one" in c["matches"], c)
    expect(c["cursor_start"] == 0 and c["cursor_end"] == 8, c)
    c = kc.complete("zzzq", 4, reply=True, timeout=10)["content"]
    expect(c["matches"] == [], c)


@check("inspect")
def _():
    c = kc.inspect("procs:call", 8, reply=True, timeout=10)["content"]
    expect(c["found"] and "Calls kernel" in c["data"]["text/plain"], c)
    c = kc.inspect("no_such_name", 3, reply=True, timeout=10)["content"]
    expect(not c["found"], c)


@check("is_complete_history_comms")
def _():
    kc.is_complete("function f()")
    c = kc.get_shell_msg(timeout=10)["content"]
    expect(c["status"] == "incomplete", c)
    kc.history()
    c = kc.get_shell_msg(timeout=10)["content"]
    expect(c["status"] == "ok" and c["history"] == [], c)
    kc.comm_info()
    c = kc.get_shell_msg(timeout=10)["content"]
    expect(c["status"] == "ok" and c["comms"] == {}, c)


@check("bad_signature")
def _():
    mark = os.path.join(scratch, "ran")
    bad = Session(key=b"not-the-key", username="intruder")
    bad.send(kc.shell_channel.socket, bad.msg("execute_request", content={
        "code": 'io.open("%s", "w"):close()' % mark, "silent": False, "store_history": True,
        "user_expressions": {}, "allow_stdin": False}))
    r, _ = execute(kc, "1")  # answered after the bad one was read: it was dropped, not queued
    expect(r["status"] == "ok", r)
    expect(not os.path.exists(mark), "the badly signed cell ran")
    log = open(ERR).read()
    expect("bad signature" in log, log[-500:])


def proc_pids():
    return pids_of(kc)


@check("restart")
def _():
    global kc
    execute(kc, 'keep = hosts:spawn_procs{procs = 1}; keep:persist("jupyter_check")')
    pids, old = proc_pids(), km.provisioner.process.pid
    km.restart_kernel(now=False)
    said = ""
    try:
        while "leaving persistent mesh" not in said:
            m = kc.get_iopub_msg(timeout=5)
            if m["msg_type"] == "stream":
                said += m["content"]["text"]
    except Exception:
        pass
    expect("leaving persistent mesh 'jupyter_check' running" in said, "not said at restart: %r" % said[-300:])
    kc.stop_channels()
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=RUN_TIMEOUT)
    expect(km.provisioner.process.pid != old, "the same process")
    r, out = execute(kc, "return x")
    expect(of_type(out, "execute_result")[0]["data"]["text/plain"] == "nil", out)
    r, out = execute(kc, 'm = monarch.attach("jupyter_check") return #m:proc_list()')
    expect(r["status"] == "ok" and of_type(out, "execute_result")[0]["data"]["text/plain"] == "1", (r, out))
    execute(kc, "m:stop()")


@check("shutdown")
def _():
    execute(kc, 'procs = hosts:spawn_procs{procs = 2}')
    pids, proc = proc_pids(), km.provisioner.process
    km.shutdown_kernel(now=False)
    rc = proc.wait(timeout=15)
    expect(rc == 0, "the kernel exited with %r" % rc)
    expect(wait_gone(pids), "the kernel's procs outlived its shutdown")


finish(km, kc)
