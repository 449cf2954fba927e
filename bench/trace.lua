-- bench/trace.lua: what tracing costs the no-op round trip, run by bench/run.sh.
--   monarch-run bench/trace.lua [quick]
-- Batches of call_one("noop"):get() alternate between tracing off and on
-- (monarch.trace.start before an "on" batch, stop after it, outside the
-- timing; their order swaps every pair), so both medians come from the
-- same minutes of a noisy machine.
-- Prints "name value" lines.
local monarch = require "monarch"
local quick = arg[1] == "quick"

local median = require("bench.stats").median

local one = monarch.hosts():spawn_procs{ procs = 1 }
one:load "basic"
local path = os.tmpname()

local function batch(per)
  collectgarbage() -- each batch starts from a clean heap: a stop's garbage is not the next batch's cost
  local t0 = monarch.now()
  for _ = 1, per do one:call_one("noop"):get() end
  return (monarch.now() - t0) / per * 1e6
end

local batches, per = quick and 15 or 41, quick and 500 or 500
batch(500)
local off, on = {}, {}
local function traced(per)
  monarch.trace.start(path)
  local us = batch(per) -- its spans are recorded; the drains (every second) run inside it too
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
print(string.format("trace_off_rtt_us %.2f", median(off)))
print(string.format("trace_on_rtt_us %.2f", median(on)))
print(string.format("trace_on_ratio %.3f", median(on) / median(off)))

-- The same cost without the wake-ups that make a round trip noisy: calls
-- pipelined to one proc, where what tracing adds per call shows as CPU time.
local function pipelined(n)
  collectgarbage()
  local t0 = monarch.now()
  local last
  for _ = 1, n do last = one:call_one("noop") end
  last:get() -- one proc runs in order: the last done means all done
  return (monarch.now() - t0) / n * 1e9
end
local poff, pon, n = {}, {}, quick and 10000 or 20000
pipelined(n)
for b = 1, quick and 3 or 7 do
  poff[b] = pipelined(n)
  monarch.trace.start(path)
  pon[b] = pipelined(n)
  monarch.trace.stop()
end
os.remove(path)
print(string.format("trace_pipelined_off_ns %.0f", median(poff)))
print(string.format("trace_pipelined_on_ns %.0f", median(pon)))
