#!/usr/bin/env python3
"""Opens a notebook in the classic Jupyter notebook server (Debian's
jupyter-notebook) in headless Chromium through selenium, runs all its cells on
the Monarch kernel, and checks the page: the plot's SVG is there and the last
cell printed what it should. Exit 0 and "browser ok"; 3 when Chromium or its
driver cannot start here (the spec then marks the test pending); 1 otherwise.

  browser_notebook.py SCRATCH MONARCH_RUN NOTEBOOK [-- options for the kernel]
"""
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

args = sys.argv[1:]
extra = args[args.index("--") + 1:] if "--" in args else []
args = args[:args.index("--")] if "--" in args else args
scratch, run, notebook = args[0], args[1], args[2]
os.makedirs(scratch, exist_ok=True)
subprocess.run([run] + extra + ["--install-kernel", "--prefix", scratch], check=True, stdout=subprocess.DEVNULL)
env = dict(os.environ, JUPYTER_PATH=os.path.join(scratch, "share", "jupyter"),
           JUPYTER_RUNTIME_DIR=os.path.join(scratch, "runtime"), JUPYTER_CONFIG_DIR=os.path.join(scratch, "config"))
shutil.copy(notebook, scratch)
name = os.path.basename(notebook)

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
token = secrets.token_hex(16)
server = subprocess.Popen(["jupyter-notebook", "--no-browser", "--ip=127.0.0.1", "--port=%d" % port,
                           "--NotebookApp.token=" + token, "--notebook-dir=" + scratch, "--allow-root"],
                          env=env, stdout=open(os.path.join(scratch, "server.log"), "w"), stderr=subprocess.STDOUT)


def fail(code, why):
    print(why, flush=True)
    server.terminate()
    server.wait(timeout=20)
    sys.exit(code)


base = "http://127.0.0.1:%d" % port
deadline = time.time() + 60
while True:
    try:
        urllib.request.urlopen(base + "/api/status?token=" + token, timeout=2)
        break
    except Exception:
        if time.time() > deadline or server.poll() is not None:
            fail(1, "the notebook server did not start: " + open(os.path.join(scratch, "server.log")).read()[-500:])
        time.sleep(0.2)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

opts = webdriver.ChromeOptions()
for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
    opts.add_argument(a)
if os.path.exists("/usr/bin/chromium"):
    opts.binary_location = "/usr/bin/chromium"
try:
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "chromedriver"), options=opts)
except Exception as e:
    fail(3, "chromium could not start: %s" % str(e).splitlines()[0])

try:
    driver.get("%s/notebooks/%s?token=%s" % (base, name, token))
    ready = ("return window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel && "
             "Jupyter.notebook.kernel.is_connected()")
    deadline = time.time() + 60
    while not driver.execute_script(ready):
        if time.time() > deadline:
            fail(1, "the notebook's kernel did not connect")
        time.sleep(0.2)
    driver.execute_script("Jupyter.notebook.execute_all_cells()")
    done = ("var cs = Jupyter.notebook.get_cells().filter(function (c) { return c.cell_type == 'code'; });"
            "return cs.every(function (c) { return c.input_prompt_number !== '*' && c.input_prompt_number != null; });")
    deadline = time.time() + 180
    while not driver.execute_script(done):
        if time.time() > deadline:
            fail(1, "the cells did not all run in 180 s")
        time.sleep(0.5)
    svgs = driver.execute_script("return document.querySelectorAll('.output_area svg').length")
    errors = driver.execute_script("return document.querySelectorAll('.output_error').length")
    last = driver.execute_script("var cs = Jupyter.notebook.get_cells(); "
                                 "return cs[cs.length - 1].output_area.element[0].innerText")
    if errors or svgs < 1 or "persisted 4 procs" not in last:
        fail(1, "page: %d SVG, %d errors, last cell said %r" % (svgs, errors, last))
    driver.execute_script("Jupyter.notebook.kernel.kill()")
    time.sleep(1)
finally:
    driver.quit()
server.terminate()
server.wait(timeout=20)
print("browser ok: %d SVG in the page, last cell said %r" % (svgs, last.strip()), flush=True)
