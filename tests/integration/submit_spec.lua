-- A call's submit is a transaction: it raises only before anything is
-- registered or sent, and after that every slot is sent or failed, so no
-- raise leaves a record behind for the shutdown to wait on (issue 27).
local monarch = require "monarch"
local core = require "monarch.core"
local runtime = require "monarch.runtime"
local shell = require "support.shell"
local tensor = require "monarch.tensor"
local bulk = require "monarch.bulk"

local RUN = (os.getenv("MONARCH_BUILD") or "build") .. "/bin/monarch-run"

local function fails(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  return err
end

-- Pumps the loop until pred() holds (10 s at most); returns whether it did.
local function poll_until(pred)
  local t0 = runtime.now()
  while not pred() do
    if runtime.now() - t0 > 10 then return false end
    runtime.pump(0.02)
  end
  return true
end

-- No call of the script's own is left in the table of calls.
local function no_records_left()
  poll_until(function() return runtime.stats().calls_in_flight == 0 end)
  assert.are.equal(0, runtime.stats().calls_in_flight, "a call's record was left behind")
end

describe("a call that raises", function()
  it("lets the script go on and shut down (the script of the issue, run by monarch-run)", function()
    local script = os.tmpname()
    shell.write(script, [[
local monarch = require "monarch"
local p = monarch.hosts():spawn_procs{ procs = 2 }
p:load "basic"
print(pcall(function() return p:call("echo", function() end) end))
print(p:call("noop"):get())
local wide = monarch.hosts():spawn_procs{ procs = 8 }
wide:load "basic"
print(pcall(function() return wide:call("echo", 1, coroutine.create(print)) end))
print(pcall(function() return wide:slice{ procs = 0 }:call_one("echo", { f = print }) end))
print("sum", wide:call("echo", 3):get()[1])
monarch.shutdown()
print "shut down"
]])
    local out, rc = shell.run("timeout 60 " .. RUN .. " " .. script)
    os.remove(script)
    assert.are.equal(0, rc, out)
    assert.matches("false\tcall 'echo': argument 1: a function cannot be sent to a proc", out, 1, true)
    assert.matches("call 'echo': argument 2: a thread cannot be sent", out, 1, true)
    assert.matches("call 'echo': argument 1: a function cannot be sent", out, 1, true)
    assert.matches("sum\t3", out, 1, true)
    assert.matches("shut down", out, 1, true)
    -- The message names what was wrong, not a file of ours.
    assert.is_nil(out:find("calls.lua", 1, true), out)
    assert.is_nil(out:find("mesh.lua", 1, true), out)
  end)
end)

describe("submit", function()
  local procs

  setup(function()
    procs = monarch.hosts():spawn_procs{ procs = 16 } -- from 16, mesh-wide calls go through the agent
    procs:load "basic"
  end)

  teardown(function() procs:stop() end)

  it("raises for an unencodable argument before registering anything, on every path", function()
    local before = runtime.stats().calls_in_flight
    local err = fails(function() return procs:call("echo", print) end)
    assert.matches("^call 'echo': argument 1: a function cannot be sent", tostring(err))
    err = fails(function() return procs:slice{ procs = 1 }:call_one("echo", 1, 2, print) end)
    assert.matches("^call 'echo': argument 3: a function", tostring(err))
    err = fails(function() procs:broadcast("echo", print) end)
    assert.matches("^call 'echo': argument 1: a function", tostring(err))
    assert.are.equal(before, runtime.stats().calls_in_flight)
    local v = procs:call("echo", 7):get()
    for i = 1, 16 do assert.are.equal(7, v[i]) end
    no_records_left()
  end)

  it("names the argument when a mesh with a dead proc takes the per-slot path", function()
    local m = monarch.hosts():spawn_procs{ procs = 3 }
    m:load "basic"
    local victim = m:slice{ procs = 2 }
    victim:stop()
    assert.is_true(poll_until(function() return tostring(m):find("2 alive", 1, true) ~= nil end))
    local err = fails(function() return m:call("echo", print) end)
    assert.matches("^call 'echo': argument 1: a function cannot be sent", tostring(err))
    -- The dead proc's slot fails; the others answer.
    local ok, e = pcall(function() return m:call("echo", 5):get() end)
    assert.is_false(ok)
    assert.are.equal("proc_failed", e.kind)
    assert.are.equal(2, e.rank)
    assert.are.equal(5, m:slice{ procs = 0 }:call_one("echo", 5):get())
    m:stop()
    no_records_left()
  end)

  it("fails the slot of a proc whose connection closed before the script heard, on every path", function()
    local m = monarch.hosts():spawn_procs{ procs = 4 }
    m:load "basic"
    local ps = m:proc_list()
    local deaths = 0
    m:on_failure(function() deaths = deaths + 1 end) -- the procs this test cuts off die, as it expects
    local t, src = m:tensor("f32", { 4 }), tensor.host("f32", { 4 })
    t:put(src):get() -- the procs are probed for the same-host path
    local function closed_under(p)
      core.disconnect(p.conn, "closed by the test")
      assert.are.equal("ready", p.state) -- the script has not heard yet
    end
    local function fails_as_closed(fut, rank)
      local ok, e = pcall(fut.get, fut, 10)
      assert.is_false(ok)
      assert.are.equal("proc_failed", e.kind)
      assert.are.equal(rank, e.rank)
      assert.matches("connection closed before the call was sent", tostring(e), 1, true)
    end
    local function dead(p) return function() return p.state == "dead" end end
    -- A same-host put (bulk.queue, slot by slot).
    local puts0 = bulk.stats.local_puts
    closed_under(ps[4])
    fails_as_closed(t:put(src), 3)
    assert.is_true(bulk.stats.local_puts > puts0, "the put took the same-host path")
    assert.is_true(poll_until(dead(ps[4])))
    -- A mesh-wide call whose procs the script all thinks ready (core.call's skipped slots).
    closed_under(ps[3])
    fails_as_closed(m:slice{ procs = { 0, 3 } }:call("echo", 1), 2)
    assert.is_true(poll_until(dead(ps[3])))
    -- A call that takes the per-slot path, its mesh having dead procs (core.call_as).
    closed_under(ps[2])
    fails_as_closed(m:call("echo", 1), 1)
    assert.are.equal(2, m:slice{ procs = 0 }:call_one("echo", 2):get()) -- the others still answer
    assert.is_true(poll_until(dead(ps[2])))
    assert.are.equal(3, deaths)
    t = nil -- its frees go to the live proc alone
    collectgarbage()
    m:stop()
    no_records_left()
  end)

  it("fails the slots it could not queue for memory, and the next casts go on", function()
    procs:call("noop"):get() -- frees an earlier case's GC queued go out first: they would take targets too
    local stats0 = core.cast_stats()
    core.test_fail_queue(3) -- the third target from now fails for memory: two are gathered for the agent by then
    local ok, e = pcall(function() return procs:call("echo", 1):get() end)
    assert.is_false(ok)
    assert.are.equal("memory", e.kind)
    assert.are.equal(2, e.rank) -- slots 3..16 failed; the lowest rank is named
    assert.are.equal(13, e.others)
    assert.matches("ran out of memory queueing this call", tostring(e), 1, true)
    -- A single call that fails for memory.
    core.test_fail_queue(1)
    ok, e = pcall(function() return procs:slice{ procs = 0 }:call_one("echo", 1):get() end)
    assert.is_false(ok)
    assert.are.equal("memory", e.kind)
    -- Nothing of the failed casts is left in the cast state: the next ones are whole.
    for round = 1, 3 do
      local v = procs:call("echo", round):get()
      for i = 1, 16 do assert.are.equal(round, v[i]) end
    end
    assert.is_true(core.cast_stats().casts > stats0.casts, "mesh-wide calls went through the agents")
    no_records_left()
  end)
end)
