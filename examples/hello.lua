-- hello.lua: spawn a mesh, load a kernel library, call kernels, print a ValueMesh.
--   monarch-run examples/hello.lua
local monarch = require "monarch"

local procs = monarch.hosts():spawn_procs{ procs = 4 }
print(procs)
procs:load "basic"

-- Every proc answers with its rank and the world size.
local ranks = procs:call("rank"):get()
print(ranks)

-- A tensor on every proc: fill it, scale it, sum it where it lives.
local t = procs:tensor("f32", { 1024 })
procs:call("fill", t, 0.5):get()
procs:call("scale", t, 2.0):get()
local sums = procs:call("sum", t):get()
for coords, s in sums:items() do
  print(string.format("proc %d: sum = %g", coords.procs, s))
end

-- One proc, by coordinates.
local one = procs:slice{ procs = 2 }
print("echo from procs=2:", one:call_one("echo", "hello", 42):get()[1])
