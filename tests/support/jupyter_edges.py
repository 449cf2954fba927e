#!/usr/bin/env python3
"""The Jupyter kernel at its edges, driven by jupyter_client: values that cannot
be shown, requests with odd numbers, a replayed message, an execute_request on
control while a cell runs, output before a long computation, what a cell's last
line shows, inspection of the notebook's own functions, and a front end that
dies without a shutdown (jupyter_driver.py: the kernelspec, the kernel, one line
per check). Every wait is bounded.

  jupyter_edges.py SCRATCH_DIR MONARCH_RUN [-- options for the kernel, e.g. --hosts H:P]
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from jupyter_driver import (RUN_TIMEOUT, ERR, scratch, run, extra, check, start, execute, of_type,  # noqa: E402
                            result_text, expect, alive, wait_gone, proc_pids, finish)
from jupyter_client.jsonutil import json_default  # noqa: E402
from jupyter_client.session import Session  # noqa: E402

km, kc = start()


def still_alive():
    r, out = execute(kc, "1 + 1", timeout=10)
    expect(r["status"] == "ok" and result_text(out) == "2", "the kernel does not answer: %r" % ((r, out),))


@check("unshowable_value")
def _():
    r, out = execute(kc, 'setmetatable({}, {__tostring = function() error("no picture") end})')
    expect(r["status"] == "error" and "cannot be shown" in r["evalue"] and "no picture" in r["evalue"], r)
    r, out = execute(kc, 'error(setmetatable({}, {__tostring = function() error("nor this") end}))')
    expect(r["status"] == "error" and "cannot be shown" in r["evalue"], r)
    still_alive()


def raw_session():
    """A session with the kernel's key whose JSON may hold NaN and Infinity (jupyter_client's refuses them)."""
    s = Session(key=kc.session.key, username="edges")
    s.pack = lambda o: json.dumps(o, default=json_default, allow_nan=True).encode()
    return s


def complete_raw(code, pos):
    s = raw_session()
    s.send(kc.shell_channel.socket, s.msg("complete_request", content={"code": code, "cursor_pos": pos}))
    return kc.get_shell_msg(timeout=10)["content"]


@check("cursor_pos_clamped")
def _():
    for pos, start_ in ((float("inf"), 0), (float("nan"), 0), (2.5, 0), (-3, 0), (1e300, 0)):
        c = complete_raw("pri", pos)
        expect(c["status"] == "ok" and c["cursor_start"] == start_ and c["cursor_end"] in (0, 2, 3), (pos, c))
        expect(isinstance(c["cursor_end"], int), (pos, c))
    c = complete_raw("pri", 3)
    expect("print" in c["matches"], c)
    still_alive()


@check("replayed_message")
def _():
    mark = os.path.join(scratch, "replayed")
    code = 'local f = io.open("%s", "a") f:write("x") f:close()' % mark
    msg = kc.session.msg("execute_request", content={"code": code, "silent": False, "store_history": True,
                                                     "user_expressions": {}, "allow_stdin": False})
    frames = kc.session.serialize(msg)
    kc.shell_channel.socket.send_multipart(frames)
    kc.get_shell_msg(timeout=RUN_TIMEOUT)
    kc.shell_channel.socket.send_multipart(frames)  # the same signed bytes again
    still_alive()  # answered after the replay was read
    expect(open(mark).read() == "x", "the replayed cell ran again: %r" % open(mark).read())
    expect("replayed message" in open(ERR).read(), open(ERR).read()[-500:])


@check("execute_on_control_while_busy")
def _():
    execute(kc, 'procs = hosts:spawn_procs{procs = 1}; procs:load "basic"')
    msg_id = kc.execute('procs:call_one("sleep", 2):get() return "outer"')
    time.sleep(0.5)
    kc.session.send(kc.control_channel.socket, kc.session.msg("execute_request", content={
        "code": "return 'nested'", "silent": False, "store_history": True, "user_expressions": {},
        "allow_stdin": False}))
    c = kc.get_control_msg(timeout=10)["content"]
    expect(c["status"] == "error" and "a cell is running" in c["evalue"], c)
    t0 = time.time()
    km.interrupt_kernel()  # the outer cell can still be stopped
    reply = kc.get_shell_msg(timeout=15)
    expect(reply["parent_header"]["msg_id"] == msg_id and "interrupted" in reply["content"].get("evalue", ""),
           reply["content"])
    expect(time.time() - t0 < 1.5, "the interrupt took %.1f s" % (time.time() - t0))


@check("print_before_long_computation")
def _():
    msg_id = kc.execute('print("started") local t = os.clock() while os.clock() - t < 2 do end return "done"')
    t0, got = time.time(), None
    while time.time() - t0 < 10 and got is None:
        m = kc.get_iopub_msg(timeout=10)
        if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
            got = time.time() - t0
    expect(got is not None and got < 1.5, "the line came %s s after the cell started (it computes 2 s)" % got)
    kc.get_shell_msg(timeout=RUN_TIMEOUT)


@check("last_line_value")
def _():
    for code, want in (("x = 1\nmath.max(x, 2)", "2"), ("y = 3\ny", "3"),
                       # the last line ends a block: a return put before it would end the loop at once
                       ("n = 0\nfor i = 1, 3 do n = n + i\n  tostring(i) end", None), ("n", "6"),
                       ("m = 0\nfor i = 1, 3 do m = m + i end\nm", "6")):
        r, out = execute(kc, code)
        expect(r["status"] == "ok" and result_text(out) == want, (code, r, out))
    r, out = execute(kc, 'local v = procs:call("rank"):get()\nv')
    expect("ValueMesh" in (result_text(out) or ""), out)


@check("quiet_values")
def _():
    for code in ('display("pic")', 'io.write("w\\n")', 'io.stdout:write("s\\n")', 'h = display("a")\nh'):
        r, out = execute(kc, code)
        expect(r["status"] == "ok" and not of_type(out, "execute_result"), (code, out))
    r, out = execute(kc, 'io.output():write("to the cell\\n")')
    text = "".join(s["text"] for s in of_type(out, "stream"))
    expect(text == "to the cell\n" and not of_type(out, "execute_result"), out)


@check("not_utf8_everywhere")
def _():
    r, out = execute(kc, 'string.char(0xff, 0x41)')
    expect(result_text(out) == "?A", out)
    r, out = execute(kc, 'error("bad " .. string.char(0xfe))')
    expect(r["status"] == "error" and r["evalue"].endswith("bad ?") and r["traceback"][0].endswith("bad ?"), r)
    r, out = execute(kc, 'display(string.char(0xc3))')
    expect(of_type(out, "display_data")[0]["data"]["text/plain"] == "?", out)


@check("monarch_error_frames")
def _():
    r, out = execute(kc, 'local function f()\n  procs:call_one("no_such_kernel"):get()\nend\nf()')
    expect(r["status"] == "error" and r["ename"] == "MonarchError", r)
    expect(any("stdin:2" in line for line in r["traceback"]), r["traceback"])


@check("user_expressions")
def _():
    r, _ = execute(kc, "z = 7", user_expressions={"twice": "z * 2", "bad": "nil + 1"})
    ue = r["user_expressions"]
    expect(ue["twice"]["status"] == "ok" and ue["twice"]["data"]["text/plain"] == "14", ue)
    expect(ue["bad"]["status"] == "error" and "arithmetic" in ue["bad"]["evalue"], ue)


@check("argument_errors_name_the_cell")
def _():
    # The cell's line where the cell calls them as a statement; no position where it returns their value
    # (a tail call: Lua keeps no frame to name), and never one inside the kernel.
    for code, want in (("top{seconds = -1}", "top: seconds"), ("x = 1\ntop{seconds = -1}", "top: seconds"),
                       ("top{seconds = -1}; x = 2", "stdin:1: top: seconds"),
                       ('train_live({}, "x"); x = 2', "stdin:1: train_live: args"),
                       ('train_live({}, "x")', "train_live: args")):
        r, _ = execute(kc, code)
        expect(r["status"] == "error" and r["evalue"].startswith(want), (code, r))


@check("train_live_failure_picture")
def _():
    r, out = execute(kc, 'train_live({step = function() end}, {"--bogus"})')
    expect(r["status"] == "error", r)
    d, u = of_type(out, "display_data"), of_type(out, "update_display_data")
    expect(d and d[0]["data"]["text/plain"] == "training ...", d)
    expect(u and u[-1]["data"]["text/plain"] == "training: stopped", u)


@check("inspect_notebook_functions")
def _():
    for name, want in (("top", "top([{seconds"), ("train_live", "train_live(spec"), ("display", "display(x"),
                       ("hosts:spawn_procs", "Spawns procs on every host")):
        c = kc.inspect(name, len(name), reply=True, timeout=10)["content"]
        expect(c["found"] and want in c["data"]["text/plain"], (name, c))


@check("stdin_input")
def _():
    prompts = []

    def answer(msg):
        prompts.append((msg["content"]["prompt"], msg["content"]["password"]))
        kc.input("monarch" if len(prompts) == 1 else "42")
    r, out = execute(kc, 'local name = input("name? ")\nlocal n = io.read("n")\n"hello " .. name .. " " .. n + 1',
                     allow_stdin=True, stdin_hook=answer)
    expect(r["status"] == "ok" and result_text(out) == "hello monarch 43", (r, out))
    expect(prompts == [("name? ", False), ("", False)], prompts)
    r, _ = execute(kc, "io.read()", allow_stdin=False)
    expect(r["status"] == "error" and "allow_stdin is false" in r["evalue"], r)
    # The stop button ends a wait for input; nobody answers this one.
    msg_id = kc.execute("io.read()", allow_stdin=True)
    kc.get_stdin_msg(timeout=10)
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=10)
    expect(reply["parent_header"]["msg_id"] == msg_id and "interrupted" in reply["content"].get("evalue", ""),
           reply["content"])
    still_alive()


# A front end that dies (SIGKILL) without a shutdown: its kernel stops, and the kernel's procs with it.
ORPHAN = r"""
import os, sys, time
sys.path.insert(0, %(here)r)
sys.argv = [sys.argv[0], %(scratch)r, %(run)r, "--"] + %(extra)r
from jupyter_driver import start, execute, proc_pids
km, kc = start()
execute(kc, 'procs = hosts:spawn_procs{procs = 2}')
print(km.provisioner.process.pid, " ".join(map(str, proc_pids(kc))), flush=True)
time.sleep(600)
"""


@check("front_end_dies")
def _():
    here = os.path.dirname(os.path.abspath(__file__))
    code = ORPHAN % {"here": here, "scratch": os.path.join(scratch, "orphan"), "run": run, "extra": extra}
    fe = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = fe.stdout.readline().split()
        expect(len(line) == 3, "the front end said %r" % line)
        pids = [int(p) for p in line]
        expect(all(alive(p) for p in pids), pids)
        fe.kill()
        fe.wait(timeout=10)
        expect(wait_gone(pids[:1], timeout=10), "the kernel outlived its front end by 10 s")
        expect(wait_gone(pids[1:], timeout=10), "the kernel's procs outlived it")
    finally:
        fe.kill()


finish(km, kc)
