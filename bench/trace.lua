-- bench/trace.lua: what tracing costs the no-op round trip, run by bench/run.sh.
--   monarch-run bench/trace.lua [quick] [startstop]
-- Batches of call_one("noop"):get() alternate between tracing off and on
-- (off-on, then on-off: neither side always runs first), so both medians
-- come from the same minutes of a noisy machine. One recording runs
-- throughout: an "off" batch runs it paused, an "on" batch resumed, and
-- its time includes collecting its spans (a flush: what the drains do),
-- so it pays for every span it made. Pausing rather than a start before
-- each "on" batch and a stop after it: a stop polls without sleeping and
-- writes the file, which leaves the threads of the round trip placed
-- differently on the cores for the batch after it (docs/tracing.md#cost).
-- "startstop" measures that way instead, to compare.
-- Prints "name value" lines.
local monarch = require "monarch"
local quick, startstop = false, false
for _, a in ipairs(arg) do
  quick = quick or a == "quick"
  startstop = startstop or a == "startstop"
end

local median = require("bench.stats").median

local one = monarch.hosts():spawn_procs{ procs = 1 }
one:load "basic"
local path = os.tmpname()

-- Runs fn() (the calls) with tracing on; returns the seconds of fn and of collecting what it recorded.
local function traced(fn)
  if startstop then monarch.trace.start(path) else monarch.trace.resume() end
  local t0 = monarch.now()
  fn()
  if startstop then
    local t = monarch.now() - t0
    monarch.trace.stop()
    return t
  end
  monarch.trace.flush()
  local t = monarch.now() - t0
  monarch.trace.pause()
  return t
end

local function untraced(fn)
  local t0 = monarch.now()
  fn()
  return monarch.now() - t0
end

local per = 500
local function calls()
  for _ = 1, per do one:call_one("noop"):get() end
end

-- Each batch starts from a clean heap: the last batch's garbage is not the next one's cost.
local function batch(on)
  collectgarbage()
  return (on and traced or untraced)(calls) / per * 1e6
end

local batches = quick and 15 or 41
if not startstop then
  monarch.trace.start(path)
  monarch.trace.pause()
end
batch(false)
local off, on = {}, {}
for b = 1, batches do
  if b % 2 == 1 then
    off[b], on[b] = batch(false), batch(true)
  else
    on[b], off[b] = batch(true), batch(false)
  end
end
print(string.format("trace_off_rtt_us %.2f", median(off)))
print(string.format("trace_on_rtt_us %.2f", median(on)))
print(string.format("trace_on_ratio %.3f", median(on) / median(off)))

-- The same cost without the wake-ups that make a round trip noisy: calls
-- pipelined to one proc, where what tracing adds per call shows as CPU time.
local n = quick and 10000 or 20000
local function pipelined()
  local last
  for _ = 1, n do last = one:call_one("noop") end
  last:get() -- one proc runs in order: the last done means all done
end
local function piped(on)
  collectgarbage()
  return (on and traced or untraced)(pipelined) / n * 1e9
end
local poff, pon = {}, {}
piped(false)
for b = 1, quick and 3 or 7 do
  poff[b] = piped(false)
  pon[b] = piped(true)
end
if not startstop then monarch.trace.stop() end
os.remove(path)
print(string.format("trace_pipelined_off_ns %.0f", median(poff)))
print(string.format("trace_pipelined_on_ns %.0f", median(pon)))
