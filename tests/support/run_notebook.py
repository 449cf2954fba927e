#!/usr/bin/env python3
"""Runs notebooks headless on the Monarch kernel with nbclient, in order, as
`jupyter nbconvert --execute` would, and checks what they show: the first has
an SVG plot and every code cell ran without an error. Installs the kernelspec
into SCRATCH with the options after --. Prints "notebook ok" at the end.

  run_notebook.py SCRATCH MONARCH_RUN NOTEBOOK... [-- options for the kernel]
"""
import os
import subprocess
import sys

import nbformat
from nbclient import NotebookClient

args = sys.argv[1:]
extra = args[args.index("--") + 1:] if "--" in args else []
args = args[:args.index("--")] if "--" in args else args
scratch, run, notebooks = args[0], args[1], args[2:]
os.makedirs(scratch, exist_ok=True)
subprocess.run([run] + extra + ["--install-kernel", "--prefix", scratch], check=True, stdout=subprocess.DEVNULL)
os.environ["JUPYTER_PATH"] = os.path.join(scratch, "share", "jupyter")

for i, path in enumerate(notebooks):
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="monarch", resources={"metadata": {"path": scratch}}).execute()
    outs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outs if o.output_type == "error"]
    if errors:
        sys.exit("%s: a cell failed: %s" % (path, errors[0].get("traceback")))
    if i == 0 and not any("image/svg+xml" in o.get("data", {}) for o in outs):
        sys.exit("%s: no SVG plot among the outputs" % path)
    last = nb.cells[-1] if nb.cells[-1].cell_type == "code" else [c for c in nb.cells if c.cell_type == "code"][-1]
    text = "".join(o.get("text", "") for o in last.outputs if o.output_type == "stream")
    print("%s: %d cells, last said: %s" % (path, len(nb.cells), text.strip()), flush=True)
    out = os.path.join(scratch, os.path.basename(path))
    nbformat.write(nb, out)
print("notebook ok", flush=True)
