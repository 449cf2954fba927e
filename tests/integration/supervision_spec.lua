-- Supervision through the host agents (issue 14): the controller heartbeats
-- agents only; each agent watches its procs' status lines and reports a
-- silent one (PROC_HUNG). Real agents and procs.
local monarch = require "monarch"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local agent = require "support.agent"

local sh = require("support.shell").quiet

local alive = require("support.procstat").alive

describe("supervision through the host agents", function()
  local daemon

  setup(function()
    monarch.hosts()
    -- Procs give up 1 s after their controller is gone.
    daemon = agent.start{ token = runtime.token, args = "--orphan-timeout 1" }
  end)

  teardown(function()
    if daemon then daemon:stop() end
  end)

  -- What each test made and changed is undone after it. (busted keeps only a
  -- test's last finally(): one per mesh left every mesh but the last running,
  -- and a proc of it failed in whichever spec ran next, once the daemon was gone.)
  local made = {}
  after_each(function()
    for _, m in ipairs(made) do m:stop() end
    made = {}
    monarch.configure{ heartbeat_timeout = 3.0 }
  end)

  local function mesh(n)
    local agents = mesh_mod.connect_agents{ daemon.addr }
    local m = mesh_mod.host_mesh(agents):spawn_procs{ procs = n }
    made[#made + 1] = m
    m:load "basic"
    return m
  end

  it("keeps an idle proc past its orphan timeout while its controller is connected", function()
    local m = mesh(1)
    local pid = m:procs()[1].pid
    monarch.sleep(2.5) -- no call, no PING: only the agent's heartbeat goes on
    assert.is_true(alive(pid), "the idle proc orphaned itself")
    assert.are.equal(7, m:call_one("echo", 7):get(5))
  end)

  -- The loop's clock stands still while the script blocks; a connect that read
  -- it stale timed its handshake out at once (a CI failure of this spec).
  it("connects to an agent after the script blocked longer than the handshake timeout", function()
    local m0 = mesh(1) -- a live connection, so heartbeats tick
    os.execute("sleep 5.5")
    local m = mesh(1)
    assert.are.equal(7, m:call_one("echo", 7):get(5))
    assert.are.equal(8, m0:call_one("echo", 8):get(5))
  end)

  it("has the agent report a stopped proc; the controller kills it and names it unresponsive", function()
    monarch.configure{ heartbeat_timeout = 1.0 }
    local m = mesh(2)
    m:on_failure(function() end)
    local victim = m:procs()[2]
    local f = m:slice{ procs = 1 }:call_one("sleep", 30)
    sh("kill -STOP " .. victim.pid)
    local t0 = monarch.now()
    local ok, err = pcall(f.get, f, 10)
    local took = monarch.now() - t0
    assert.is_false(ok)
    assert.are.equal("unresponsive", err.kind)
    assert.matches("seen by its host agent", err.message)
    assert.is_true(took > 0.5 and took < 3, "detected after " .. took .. " s (timeout 1 s)")
    monarch.sleep(0.3)
    assert.is_false(alive(victim.pid), "the hung proc was not killed")
    -- The other proc, busy with nothing, was never reported.
    assert.are.equal("ready", m:procs()[1].state)
    assert.are.equal(3, m:slice{ procs = 0 }:call_one("echo", 3):get(5))
  end)

  it("does not report a proc busy in a long kernel: its I/O thread still speaks", function()
    monarch.configure{ heartbeat_timeout = 0.5 }
    local m = mesh(1)
    local pid = m:procs()[1].pid
    local f = m:call_one("sleep", 2)
    f:get(10)
    assert.are.equal(pid, m:procs()[1].pid)
    assert.are.equal("ready", m:procs()[1].state)
  end)
end)
