-- bench/failures.lua: how fast failures are seen and healed.
--   monarch-run bench/failures.lua [quick]
-- kill -9 -> failure event (the future failing), and kill -9 -> restarted proc serving again.
local monarch = require "monarch"
local quick = arg[1] == "quick"

local median = require("bench.stats").median

local procs = monarch.hosts():spawn_procs{ procs = 2 }:options{ restart = true }
procs:load "basic"
local one = procs:slice{ procs = 1 }
local detect, restart = {}, {}
local seen = 0
procs:on_failure(function() seen = seen + 1 end)
for i = 1, quick and 3 or 7 do
  local pid = one:procs()[1].pid
  local f = one:call_one("sleep", 30)
  one:call_one("noop") -- queued behind: must fail too
  monarch.sleep(0.05)
  local t0 = monarch.now()
  os.execute("kill -9 " .. pid)
  pcall(f.get, f)
  detect[i] = monarch.now() - t0
  one:ready(30)
  one:call_one("noop"):get()
  restart[i] = monarch.now() - t0
end
print(string.format("kill_to_failure_ms %.2f", median(detect) * 1e3))
print(string.format("kill_to_serving_ms %.2f", median(restart) * 1e3))
