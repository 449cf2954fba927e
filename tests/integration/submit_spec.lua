-- A call's submit is a transaction: it raises only before anything is
-- registered or sent, and after that every slot is sent or failed, so no
-- raise leaves a record behind for the shutdown to wait on (issue 27).
local monarch = require "monarch"
local core = require "monarch.core"
local runtime = require "monarch.runtime"
local shell = require "support.shell"

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

  it("fails the slot of a proc whose connection closed before the script heard", function()
    local m = monarch.hosts():spawn_procs{ procs = 4 }
    m:load "basic"
    local p = m:proc_list()[4]
    core.disconnect(p.conn, "closed by the test")
    assert.are.equal("ready", p.state) -- the script has not heard yet
    local ok, e = pcall(function() return m:call("echo", 1):get() end)
    assert.is_false(ok)
    assert.are.equal("proc_failed", e.kind)
    assert.are.equal(3, e.rank)
    assert.matches("connection closed before the call was sent", tostring(e), 1, true)
    -- A single call to it fails the same way, and the others still answer.
    ok, e = pcall(function() return m:slice{ procs = 3 }:call_one("echo", 1):get(5) end)
    assert.is_false(ok)
    assert.are.equal("proc_failed", e.kind)
    assert.are.equal(2, m:slice{ procs = 0 }:call_one("echo", 2):get())
    m:stop()
    no_records_left()
  end)

  it("fails the slots it could not queue for memory, and the next casts go on", function()
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
