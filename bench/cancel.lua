-- bench/cancel.lua: what a timed-out call costs the calls after it.
--   monarch-run bench/cancel.lua [quick]
-- A sleep(5) cut by a 0.2 s timeout is cancelled on its proc: the next call
-- answers at once, and a throughput loop right after runs at full speed.
-- Prints "name value" lines; the baselines are measured in the same run.
local monarch = require "monarch"
local quick = arg[1] == "quick"

local median = require("bench.stats").median

local procs = monarch.hosts():spawn_procs{ procs = 1 }
procs:load "basic"
local timed = procs:options{ timeout = 0.2 }

-- Calls per second of a pipelined burst of no-ops.
local function burst(n)
  local t0 = monarch.now()
  local last
  for _ = 1, n do last = procs:call_one("noop") end
  last:get()
  return n / (monarch.now() - t0)
end

local rounds, n = quick and 3 or 5, quick and 20000 or 50000
local rtt, after, rate0, rate1 = {}, {}, {}, {}
for r = 1, rounds do
  local t0 = monarch.now()
  procs:call_one("noop"):get()
  rtt[r] = (monarch.now() - t0) * 1e3
  rate0[r] = burst(n)
  local ok = pcall(function() return timed:call_one("sleep", 5):get() end)
  assert(not ok, "the sleep was meant to time out")
  t0 = monarch.now()
  procs:call_one("noop"):get()
  after[r] = (monarch.now() - t0) * 1e3
  rate1[r] = burst(n)
end
print(string.format("noop_rtt_ms %.3f", median(rtt)))
print(string.format("next_call_after_timeout_ms %.3f", median(after)))
print(string.format("burst_calls_per_s %.0f", median(rate0)))
print(string.format("burst_after_timeout_calls_per_s %.0f", median(rate1)))
