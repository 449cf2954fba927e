-- bench/jupyter_baseline.lua ROUNDS GAP_MS: the baseline of bench/jupyter.sh's
-- noop cell, run by bench/jupyter_driver.py between its blocks of cells:
-- procs:call("noop"):get() on 8 procs timed inside monarch-run, back to back
-- ("tight"), and paced as a notebook's cells come ("paced": before each call
-- the loop waits GAP_MS, the empty cell's round trip, so the controller and
-- the procs are as idle as between two cells). Prints "tight" and "paced",
-- each followed by its samples in ms.
local monarch = require "monarch"
local runtime = require "monarch.runtime"

local rounds, gap = tonumber(arg[1]) or 200, (tonumber(arg[2]) or 1) / 1e3
local procs = monarch.hosts():spawn_procs { procs = 8 }
procs:load "basic"
for _ = 1, math.max(5, math.floor(rounds / 10)) do procs:call("noop"):get() end

local function samples(wait)
  local t = {}
  for i = 1, rounds do
    if wait > 0 then
      local till = monarch.now() + wait
      while monarch.now() < till do runtime.pump(till - monarch.now()) end
    end
    local t0 = monarch.now()
    procs:call("noop"):get()
    t[i] = string.format("%.4f", (monarch.now() - t0) * 1e3)
  end
  return table.concat(t, " ")
end

print("tight " .. samples(0))
print("paced " .. samples(gap))
procs:stop()
