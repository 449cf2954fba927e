-- Calls that time out (mesh:options{timeout = s}) leave nothing behind in
-- the controller once their late answers are in: thousands of them keep the
-- runtime's table of calls and the Lua heap bounded.
local monarch = require "monarch"
local runtime = require "monarch.runtime"

local ROUNDS = 4      -- measured rounds, after one to warm up
local PER_ROUND = 1000 -- calls that time out in each round
local HOLD = 2        -- seconds the proc is busy while they wait (issuing 1000 calls under ASan on a busy machine
                      -- took over 0.5 s: then the first answers could come before their timeouts fired)
local TIMEOUT = 0.05  -- each call's timeout, well inside HOLD

local function heap_kib()
  collectgarbage("collect")
  collectgarbage("collect")
  return collectgarbage("count")
end

describe("calls that time out", function()
  local procs, one

  setup(function()
    procs = monarch.hosts():spawn_procs{ procs = 1 }
    procs:load "basic"
    one = procs:options{ timeout = TIMEOUT }
  end)

  teardown(function() procs:stop() end)

  -- A sleep holds the proc while PER_ROUND calls queue behind it past their
  -- timeout; then a last call, answered after every one of theirs (one proc
  -- answers in order), shows that all the late answers have come back.
  local function round()
    local hold = procs:call_one("sleep", HOLD)
    local futs = {}
    for i = 1, PER_ROUND do futs[i] = one:call_one("noop") end
    for i = 1, PER_ROUND do
      local ok, err = pcall(futs[i].get, futs[i])
      assert.is_false(ok, "call " .. i .. " did not time out")
      assert.are.equal("timeout", err.kind)
    end
    hold:get()
    procs:call_one("noop"):get()
  end

  it("are dropped from the runtime's calls once their late answers arrive", function()
    local before = runtime.stats().calls_in_flight
    round()
    assert.are.equal(before, runtime.stats().calls_in_flight)
    local heap = heap_kib()
    for _ = 1, ROUNDS do
      round()
      assert.are.equal(before, runtime.stats().calls_in_flight)
    end
    -- Each record kept would cost well over a KiB: 4000 of them, megabytes.
    local grown = heap_kib() - heap
    assert.is_true(grown < 512, string.format("Lua heap grew by %.0f KiB over %d timed-out calls", grown,
      ROUNDS * PER_ROUND))
  end)
end)
