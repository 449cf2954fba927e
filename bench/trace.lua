-- bench/trace.lua: what tracing costs the no-op round trip, run by bench/run.sh.
--   monarch-run bench/trace.lua [quick]
-- Batches of call_one("noop"):get() alternate between tracing off and on
-- (monarch.trace.start before an "on" batch, stop after it, outside the
-- timing; their order swaps every pair), so both medians come from the
-- same minutes of a noisy machine.
-- Prints "name value" lines.
local monarch = require "monarch"
local quick = arg[1] == "quick"

local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2
end

local one = monarch.hosts():spawn_procs{ procs = 1 }
one:load "basic"
local path = os.tmpname()

local function batch(per)
  local t0 = monarch.now()
  for _ = 1, per do one:call_one("noop"):get() end
  return (monarch.now() - t0) / per * 1e6
end

local batches, per = quick and 7 or 15, quick and 1000 or 2000
batch(500)
local off, on = {}, {}
local function traced(per)
  monarch.trace.start(path)
  local us = batch(per)
  monarch.trace.stop()
  return us
end
for b = 1, batches do
  -- Off-on, then on-off: neither side always runs first.
  if b % 2 == 1 then
    off[b], on[b] = batch(per), traced(per)
  else
    on[b], off[b] = traced(per), batch(per)
  end
end
os.remove(path)
print(string.format("trace_off_rtt_us %.2f", median(off)))
print(string.format("trace_on_rtt_us %.2f", median(on)))
print(string.format("trace_on_ratio %.3f", median(on) / median(off)))
