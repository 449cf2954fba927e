-- bench/ship_task.lua: a library load that waits in a task (restarts, the training library, runtime.spawn) against
-- the same load from the script, on fresh copies of basic.so (each load asks the hosts; they have the file).
--   monarch-run bench/ship_task.lua   (MONARCH_KERNEL_DIR: where basic.so is; default build/lib/monarch)
-- Before 2026-12-05 a task polled the answers every 5 ms: 5.8 ms against 0.64 ms from the script.
local monarch = require "monarch"
local runtime = require "monarch.runtime"
local median = require("bench.stats").median
local m = monarch.hosts():spawn_procs{ procs = 2 }
m:load "basic"
local src = (os.getenv("MONARCH_KERNEL_DIR") or "build/lib/monarch") .. "/basic.so"
local n = 0
local dir = assert(io.popen("mktemp -d"):read("*l"), "mktemp -d failed")
local function fresh()
  n = n + 1
  local lib = dir .. "/lib_" .. n .. ".so"
  os.execute("cp " .. src .. " " .. lib .. " && printf '%08d' " .. n .. " >> " .. lib)
  return lib
end
local script, task = {}, {}
for i = 1, 15 do
  local lib = fresh()
  local t = monarch.now()
  m:load(lib)
  script[i] = (monarch.now() - t) * 1e3
  lib = fresh()
  t = monarch.now()
  local done = false
  runtime.spawn(function() m:load(lib) done = true end)
  while not done do runtime.pump(0.05) end
  task[i] = (monarch.now() - t) * 1e3
end
local t_task, t_script = median(task), median(script)
print(string.format("load from a task %.2f ms vs from the script %.2f ms: %.2fx (medians of 15)", t_task, t_script,
  t_task / t_script))
m:stop()
os.execute("rm -rf " .. dir)
