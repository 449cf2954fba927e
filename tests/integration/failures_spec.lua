-- The host manages failures: crashes, hangs and lost hosts are detected,
-- reported with host, rank, pid and cause, and healed by policy.
local monarch = require "monarch"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local agent = require "support.agent"

local function fails(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  return err
end

local sh = require("support.shell").quiet
local alive = require("support.procstat").alive

describe("failure handling", function()
  setup(function()
    monarch.hosts()
    -- Fast detection for the tests: ping every 0.1 s, silent after 1 s.
    monarch.configure{ heartbeat = 0.1, heartbeat_timeout = 1.0, reconnect = 2.0 }
  end)

  teardown(function()
    monarch.configure{ heartbeat = 0.5, heartbeat_timeout = 3.0, reconnect = 5.0 }
  end)

  it("reports kill -9 of a proc mid-call with its pid and signal", function()
    local procs = monarch.hosts():spawn_procs{ procs = 2 }
    procs:load "basic"
    local victim = procs:procs()[2]
    local f = procs:slice{ procs = 1 }:call_one("sleep", 5)
    monarch.sleep(0.1)
    local t0 = monarch.now()
    sh("kill -9 " .. victim.pid)
    local err = fails(function() return f:get() end)
    assert.is_true(monarch.now() - t0 < 1.5, "detected after " .. (monarch.now() - t0) .. " s")
    assert.are.equal("proc_failed", err.kind)
    assert.are.equal(1, err.rank)
    assert.are.equal(victim.pid, err.pid)
    assert.are.equal("sleep", err.kernel)
    assert.matches("killed by SIGKILL while running 'sleep'", err.message)
    procs:stop()
  end)

  it("finds a SIGSTOPped proc by its silence and names it unresponsive", function()
    local procs = monarch.hosts():spawn_procs{ procs = 1 }
    procs:load "basic"
    local pid = procs:procs()[1].pid
    local f = procs:call_one("sleep", 30)
    sh("kill -STOP " .. pid)
    local t0 = monarch.now()
    local err = fails(function() return f:get(10) end)
    local took = monarch.now() - t0
    assert.are.equal("unresponsive", err.kind)
    assert.matches("no heartbeat", err.message)
    assert.is_true(took < 4, "detected after " .. took .. " s")
    monarch.sleep(0.3)
    assert.is_false(alive(pid), "the hung proc was not killed")
  end)

  it("restarts a killed proc, reloads its kernels, re-creates its tensors and runs the init hook", function()
    local procs = monarch.hosts():spawn_procs{ procs = 2 }:options{ restart = true }
    procs:load "basic"
    local t = procs:tensor("f32", { 4 })
    procs:call("fill", t, 1):get()
    local hooked = {}
    procs:on_restart(function(one, rank)
      hooked[#hooked + 1] = rank
      one:call_one("fill", t, 7):get()
    end)
    local events = {}
    procs:on_failure(function(e) events[#events + 1] = e end)
    local old = procs:procs()[1].pid
    sh("kill -9 " .. old)
    local t0 = monarch.now()
    while #events == 0 and monarch.now() - t0 < 5 do monarch.sleep(0.02) end
    procs:ready(10)
    assert.are.same({ 0 }, hooked)
    assert.are.equal(1, #events)
    assert.is_true(events[1].restarting)
    local info = procs:procs()[1]
    assert.are_not.equal(old, info.pid)
    assert.are.equal("ready", info.state)
    assert.are.same({ 28, 4 }, procs:call("sum", t):get():values())
    procs:stop()
  end)

  it("retries a call whose proc died onto the restarted proc", function()
    local procs = monarch.hosts():spawn_procs{ procs = 1 }:options{ restart = true, retries = 2, backoff = 0.05 }
    procs:load "basic"
    procs:load "faulty"
    local pid = procs:procs()[1].pid
    local f = procs:call_one("sleep", 2)
    monarch.sleep(0.1)
    sh("kill -9 " .. pid)
    assert.is_nil(f:get(15)) -- ran again on the new proc
    assert.are_not.equal(pid, procs:procs()[1].pid)
    procs:stop()
  end)

  it("does not retry a kernel's own error", function()
    local procs = monarch.hosts():spawn_procs{ procs = 1 }:options{ retries = 3 }
    procs:load "faulty"
    procs:load "basic"
    local err = fails(function() return procs:call_one("fail", "deterministic"):get() end)
    assert.are.equal("kernel", err.kind)
    procs:stop()
  end)

  it("choose re-routes a call from a dying proc to a live one", function()
    local procs = monarch.hosts():spawn_procs{ procs = 3 }
    procs:load "basic"
    procs:load "faulty"
    procs:on_failure(function() end)
    -- Occupy two procs so choose picks the third, then kill it mid-call.
    local busy = { procs:slice{ procs = 0 }:call_one("sleep", 0.5), procs:slice{ procs = 1 }:call_one("sleep", 0.5) }
    local f = procs:choose("spin", 0.3)
    monarch.sleep(0.05)
    sh("kill -9 " .. procs:procs()[3].pid)
    assert.is_number(f:get(10))
    for _, b in ipairs(busy) do b:get() end
    procs:stop()
  end)

  it("reports every proc of a killed host agent and leaves none running", function()
    local daemon = agent.start{ token = runtime.token }
    local agents = mesh_mod.connect_agents{ daemon.addr }
    local procs = mesh_mod.host_mesh(agents):spawn_procs{ procs = 2 }
    procs:load "basic"
    local events = {}
    procs:on_failure(function(e) events[#events + 1] = e end)
    local f = procs:call("sleep", 10)
    daemon:stop("9")
    local err = fails(function() return f:get(15) end)
    assert.are.equal("proc_failed", err.kind)
    assert.are.equal(2, #events)
    for _, p in ipairs(procs:procs()) do
      assert.are.equal("dead", p.state)
      assert.is_false(alive(p.pid), "proc " .. p.pid .. " outlived its agent")
    end

  end)

  it("stops the script on a failure nobody handles", function()
    local procs = monarch.hosts():spawn_procs{ procs = 1 }
    local pid = procs:procs()[1].pid
    sh("kill -9 " .. pid)
    local err = fails(function()
      for _ = 1, 50 do runtime.pump(0.05) end
    end)
    assert.are.equal("proc_failed", err.kind)
    assert.matches("killed by SIGKILL", tostring(err))
  end)

  it("tells a task of a proc that died just after answering it, and does not stop the script", function()
    local procs = monarch.hosts():spawn_procs{ procs = 1 }
    procs:load "basic"
    local pid = procs:procs()[1].pid
    local answered = false
    local task = monarch.spawn(function()
      procs:call_one("noop"):await()
      answered = true
      local ok, err = pcall(function() return procs:call_one("noop"):await() end)
      return { ok = ok, err = err }
    end)
    runtime.pump(0) -- the task makes its first call
    runtime.pump(0) -- and the loop writes it out
    -- The controller does not poll while the proc answers and is killed: the
    -- answer and the agent's exit report come in one poll, the task's second
    -- call only after the proc is known dead.
    sh("sleep 0.3; kill -9 " .. pid .. "; sleep 0.3")
    local second = task:get(5)
    assert.is_true(answered)
    assert.is_false(second.ok)
    assert.are.equal("proc_failed", second.err.kind)
    assert.matches("killed by SIGKILL", tostring(second.err))
    for _ = 1, 5 do runtime.pump(0.02) end -- nothing left to raise
  end)
end)
