-- bench/core.lua: controller <-> proc figures, run by bench/run.sh under monarch-run.
--   monarch-run bench/core.lua [quick]
-- Prints "name value" lines; run.sh puts them next to the raw TCP baseline.
local monarch = require "monarch"
local quick = arg[1] == "quick"

local median = require("bench.stats").median

local hosts = monarch.hosts()
local one = hosts:spawn_procs{ procs = 1 }
one:load "basic"

-- Round trip: call_one("noop"):get(), one at a time.
local batches, per = quick and 5 or 10, quick and 500 or 2000
for _ = 1, 500 do one:call_one("noop"):get() end
local rtts = {}
for b = 1, batches do
  local t0 = monarch.now()
  for _ = 1, per do one:call_one("noop"):get() end
  rtts[b] = (monarch.now() - t0) / per * 1e6
end
print(string.format("call_one_rtt_us %.2f", median(rtts)))

-- Pipelined: issue a window of calls, then wait for all of them.
local total, window = quick and 50000 or 200000, 10000
local rates = {}
for r = 1, quick and 3 or 5 do
  local t0 = monarch.now()
  local sent = 0
  while sent < total do
    local futs = {}
    for i = 1, window do futs[i] = one:call_one("noop") end
    futs[window]:get()   -- one proc runs in order: the last done means all done
    sent = sent + window
  end
  rates[r] = total / (monarch.now() - t0)
end
print(string.format("pipelined_calls_per_s %.0f", median(rates)))

-- Broadcast + gather to 8 procs: call("noop") on the mesh, get the ValueMesh.
local eight = hosts:spawn_procs{ procs = 8 }
eight:load "basic"
for _ = 1, 200 do eight:call("noop"):get() end
local lats = {}
for b = 1, batches do
  local t0 = monarch.now()
  local m = quick and 200 or 1000
  for _ = 1, m do eight:call("noop"):get() end
  lats[b] = (monarch.now() - t0) / m * 1e6
end
print(string.format("gather8_us %.2f", median(lats)))
