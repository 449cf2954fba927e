"""What the kernel's jupyter_client drivers share (tests/support/jupyter_check.py and
jupyter_edges.py): the kernelspec installed into a scratch prefix, a kernel started
from it, cells run with bounded waits, and one printed line per check ("ok NAME" or
"FAIL NAME: why") that tests/integration/jupyter_spec.lua reads.

  DRIVER.py SCRATCH_DIR MONARCH_RUN [-- options for the kernel, e.g. --hosts H:P]
"""
import os
import subprocess
import sys
import traceback

RUN_TIMEOUT = 60  # s, longest any one cell may take here

scratch, run = sys.argv[1], sys.argv[2]
extra = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
subprocess.run([run] + extra + ["--install-kernel", "--prefix", scratch], check=True, stdout=subprocess.DEVNULL)
os.environ["JUPYTER_PATH"] = os.path.join(scratch, "share", "jupyter")
os.environ.setdefault("JUPYTER_RUNTIME_DIR", os.path.join(scratch, "runtime"))

from jupyter_client.manager import KernelManager  # noqa: E402

ERR = os.path.join(scratch, "kernel.err")  # the kernel's stderr: its log
results = []


def check(name):
    def wrap(fn):
        try:
            fn()
            results.append(name)
            print("ok " + name, flush=True)
        except Exception as e:  # a failed check is reported, the others still run
            why = "".join(traceback.format_exception_only(type(e), e)).strip().replace("\n", " | ")
            print("FAIL %s: %s" % (name, why), flush=True)
        return fn
    return wrap


def start():
    km = KernelManager(kernel_name="monarch")
    km.start_kernel(stderr=open(ERR, "a"))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=RUN_TIMEOUT)
    return km, kc


def execute(kc, code, timeout=RUN_TIMEOUT, **kw):
    """Runs code; returns the reply's content and the iopub messages of the cell (type, content)."""
    out = []
    reply = kc.execute_interactive(code, timeout=timeout, output_hook=lambda m: out.append((m["msg_type"], m["content"])),
                                   **kw)
    return reply["content"], out


def of_type(out, t):
    return [c for mt, c in out if mt == t]


def result_text(out):
    res = of_type(out, "execute_result")
    return res[0]["data"]["text/plain"] if res else None


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def alive(pid):
    try:
        os.kill(pid, 0)
        return open("/proc/%d/stat" % pid).read().split()[2] != "Z"
    except (OSError, IOError):
        return False


def wait_gone(pids, timeout=15):
    import time
    deadline = time.time() + timeout
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def proc_pids(kc, mesh="procs"):
    r, out = execute(kc, 'local t = {} for _, p in ipairs(%s:proc_list()) do t[#t + 1] = p.pid end '
                         'return table.concat(t, " ")' % mesh)
    return [int(p) for p in result_text(out).split()]


def finish(km, kc):
    kc.stop_channels()
    if km.has_kernel:
        km.shutdown_kernel(now=True)
    print("done %d" % len(results), flush=True)
