-- The scale simulation (`monarch-worker --simulate`): agents whose procs are
-- virtual, answered inside the agent by built-in kernels, while the
-- controller, cast and relay paths are the production ones over real TCP.
-- A virtual proc is SPAWNED with port 0: the controller reaches it through
-- its agent only, with no socket of its own.
local monarch = require "monarch"
local core = require "monarch.core"
local mesh_mod = require "monarch.mesh"
local procs_mod = require "monarch.procs"
local status = require "monarch.status"
local runtime = require "monarch.runtime"
local agent = require "support.agent"

local sh = require("support.shell").quiet

-- This process's open file descriptors (the controller is this busted process).
local function open_fds()
  local f = io.popen("ls /proc/self/fd 2>/dev/null | wc -l")
  local n = tonumber(f:read("*a"))
  f:close()
  return n
end

describe("simulated hosts (monarch-worker --simulate)", function()
  local sims, real

  setup(function()
    monarch.hosts()
    sims = { agent.start{ token = runtime.token, args = "--simulate" },
      agent.start{ token = runtime.token, args = "--simulate" } }
  end)

  teardown(function()
    for _, d in ipairs(sims) do
      sh("kill -CONT " .. (d.pid or 0))
      d:stop()
    end
    if real then real:stop() end
  end)

  local function mesh(addrs, per)
    local m = mesh_mod.host_mesh(mesh_mod.connect_agents(addrs)):spawn_procs{ procs = per or 4 }
    finally(function() m:stop() end)
    m:load "basic"
    return m
  end

  it("spawns virtual procs: port 0, a pid no process can have, no socket each", function()
    local agents = mesh_mod.connect_agents{ sims[1].addr, sims[2].addr }
    local before = open_fds()
    local m = mesh_mod.host_mesh(agents):spawn_procs{ procs = 16 }
    finally(function() m:stop() end)
    assert.are.equal(before, open_fds(), "a virtual proc took a file descriptor")
    for _, p in ipairs(m:proc_list()) do -- the proc records, not m:procs()'s summaries
      assert.are.equal(0, p.port)
      assert.is_true(p.pid > 4194304, "pid " .. p.pid .. " is within Linux's PID_MAX_LIMIT")
      assert.are.equal("ready", p.state)
    end
    m:load "basic"
    assert.are.same({ hosts = 2, procs = 16 }, m:sizes())
  end)

  it("answers call, call_one and broadcast; echo returns its arguments, rank each proc's", function()
    local m = mesh{ sims[1].addr, sims[2].addr }
    local ranks = m:call("rank"):get(10):values()
    for i = 1, 8 do assert.are.same({ i - 1, 8 }, ranks[i]) end
    local e = m:call("echo", 1.5, "x", { a = 2 }):get(10):values()
    for i = 1, 8 do assert.are.same({ 1.5, "x", { a = 2 } }, e[i]) end
    assert.is_nil(m:call("noop"):get(10):values()[3])
    assert.are.equal(7, m:slice{ hosts = 1, procs = 2 }:call_one("echo", 7):get(10))
    m:broadcast("noop")
    local casts = core.cast_stats().casts
    m:call("noop"):get(10) -- behind the broadcast, on every proc
    assert.are.equal(2, core.cast_stats().casts - casts, "one CAST per host")
    local ok, err = pcall(function() return m:call("nope"):get(10) end)
    assert.is_false(ok)
    assert.are.equal("unknown_kernel", err.kind)
    assert.matches("simulated proc", err.message, 1, true)
  end)

  it("keeps each proc's order: a call behind a sleep answers after it", function()
    local m = mesh{ sims[1].addr }
    local t0 = monarch.now()
    local slow = m:slice{ hosts = 0, procs = 1 }:call_one("sleep", 0.3)
    local after = m:call("echo", "after")
    local v = after:get(10):values()
    assert.are.equal("ok", slow.state, "the call behind the sleep answered first")
    assert.is_true(monarch.now() - t0 >= 0.29)
    assert.are.equal("after", v[2])
  end)

  it("reports a KILL of a virtual proc as its exit; its call in flight fails", function()
    local m = mesh{ sims[1].addr }
    local events = {}
    m:on_failure(function(ev) events[#events + 1] = ev end)
    local victim = m:proc_list()[2]
    local f = m:call("sleep", 5)
    procs_mod.kill(victim, 9)
    local ok, err = pcall(f.get, f, 10)
    assert.is_false(ok)
    assert.are.equal("proc_failed", err.kind)
    assert.are.equal(1, err.rank)
    assert.matches("SIGKILL", err.message, 1, true)
    assert.are.equal(1, #events)
    assert.are.equal("dead", victim.state)
  end)

  it("restarts a killed virtual proc under restart = true: a new pid, its library loaded again", function()
    local m = mesh{ sims[2].addr }
    m = m:options{ restart = true }
    local events = {}
    m:on_failure(function(e) events[#events + 1] = e end)
    local old = m:proc_list()[3].pid
    procs_mod.kill(m:proc_list()[3], 9)
    local t0 = monarch.now()
    while #events == 0 and monarch.now() - t0 < 5 do monarch.sleep(0.02) end
    m:ready(10)
    assert.are.equal(1, #events)
    assert.is_true(events[1].restarting)
    assert.are_not.equal(old, m:proc_list()[3].pid)
    assert.are.equal(0, m:proc_list()[3].port)
    assert.are.same({ 2, 4 }, m:call("rank"):get(10):values()[3])
  end)

  it("lists the virtual procs in STATUS", function()
    local m = mesh{ sims[2].addr }
    m:call("noop"):get(10)
    local r = status.collect{ m:proc_list()[1].agent }[1]
    assert.is_true(r.ok)
    local mine = {}
    for _, p in ipairs(r.value.procs) do
      assert.is_true(p.pid > 4194304)
      if p.simulated and p.mine then mine[#mine + 1] = p end
    end
    assert.are.equal(4, #mine)
    for _, p in ipairs(mine) do
      assert.are.equal("attached", p.state)
      assert.is_true(p.executed >= 2) -- __load and noop
    end
  end)

  it("refuses what a virtual proc does not simulate with a clear error", function()
    local m = mesh{ sims[1].addr }
    local ok, err = pcall(function() return m:call("__tensor_new", 1, "f32", { 4 }):get(10) end)
    assert.is_false(ok)
    assert.are.equal("unknown_kernel", err.kind)
    assert.matches("on a simulated proc", err.message, 1, true)
    -- A PING travels on a proc's own link, which a virtual proc has not got.
    ok, err = pcall(m.ping, m)
    assert.is_false(ok)
    assert.matches("takes only calls", tostring(err), 1, true)
  end)

  it("resends what was in flight when its agent's link comes back", function()
    monarch.configure{ heartbeat_timeout = 1.0 }
    finally(function() monarch.configure{ heartbeat_timeout = 3.0 } end)
    local m = mesh{ sims[1].addr, sims[2].addr }
    m:on_failure(function() end)
    sh("kill -STOP " .. sims[1].pid)
    local f = m:call("echo", 5)
    -- Past the heartbeat timeout the agent's link is lost, and retried: the call waits, kept.
    local a = m:proc_list()[1].agent
    local deadline = monarch.now() + 5
    while a.state == "ready" and monarch.now() < deadline do monarch.sleep(0.05) end
    assert.are.equal("reconnecting", a.state)
    assert.is_false(f:done())
    sh("kill -CONT " .. sims[1].pid)
    local v = f:get(10):values()
    for i = 1, 8 do assert.are.equal(5, v[i]) end
    assert.are.equal(6, m:call("echo", 6):get(10):values()[1])
  end)

  it("loses a killed agent's virtual procs with it: one host_lost event, the survivors serve", function()
    local extra = agent.start{ token = runtime.token, args = "--simulate" }
    local m, off
    finally(function() -- one for all: busted keeps only a test's last finally()
      if off then off() end
      if m then m:stop() end
      extra:stop(9)
    end)
    m = mesh{ sims[1].addr, extra.addr }
    local events = {}
    off = monarch.on_host_loss(function(ev) events[#events + 1] = ev end)
    extra:stop(9)
    local f = m:call("sleep", 0.5)
    local ok, err = pcall(f.get, f, 10)
    assert.is_false(ok)
    assert.are.equal("proc_failed", err.kind)
    assert.matches("lost with its host", err.message, 1, true)
    local deadline = monarch.now() + 5
    while #events == 0 and monarch.now() < deadline do monarch.sleep(0.02) end
    assert.are.equal(1, #events)
    assert.are.same({ 4, 5, 6, 7 }, events[1].ranks)
    local s = m:survivors()
    assert.are.same({ 0, 1, 2, 3 }, s:rank())
    assert.are.equal(4, #s:call("rank"):get(10):values())
  end)

  it("moves only a lost host's own calls when a second host goes before the tree is rebuilt", function()
    local five, m, off = {}, nil, nil
    finally(function() -- one for all: busted keeps only a test's last finally()
      if off then off() end
      monarch.configure{ cast_min = 16, fanout = 16 }
      if m then m:stop() end
      for _, d in ipairs(five) do d:stop(9) end
    end)
    for i = 1, 5 do five[i] = agent.start{ token = runtime.token, args = "--simulate" } end
    -- Five hosts (and the others this controller holds) past a fan-out of 2: a tree of three levels.
    monarch.configure{ cast_min = 2, fanout = 2 }
    local addrs = {}
    for i, d in ipairs(five) do addrs[i] = d.addr end
    m = mesh_mod.host_mesh(mesh_mod.connect_agents(addrs)):spawn_procs{ procs = 4 }
    m:load "basic"
    local deadline = monarch.now() + 10
    repeat
      m:call("noop"):get(10)
      if core.cast_stats().routed < 3 then monarch.sleep(0.05) end
    until core.cast_stats().routed >= 3 or monarch.now() > deadline
    assert.is_true(core.cast_stats().routed >= 3, "the hosts below the top take their parents' links")
    local lost = 0
    off = monarch.on_host_loss(function() lost = lost + 1 end)
    local f = m:call("sleep", 2) -- in flight on all 20 procs, some of them through a parent
    local r0 = core.cast_stats().resent
    five[5]:stop(9) -- its loss takes every relayed call off the tree, and the routes all go direct
    deadline = monarch.now() + 10
    while lost < 1 and monarch.now() < deadline do monarch.sleep(0.02) end
    local r1 = core.cast_stats().resent
    assert.is_true(r1 - r0 >= 16, "the survivors' calls left the tree: " .. (r1 - r0))
    five[4]:stop(9) -- before any cast rebuilds the tree: only its own procs' calls move
    while lost < 2 and monarch.now() < deadline do monarch.sleep(0.02) end
    assert.are.equal(2, lost)
    assert.are.equal(r1, core.cast_stats().resent, "the second loss resent the other hosts' calls again")
    assert.is_false(pcall(f.get, f, 10)) -- 8 of its procs went with their hosts
    assert.are.equal(12, #m:survivors():call("rank"):get(10):values())
  end)

  it("runs a group of simulated hosts in one process (--hosts): each its own agent, a cast tree among them", function()
    local group = agent.start{ token = runtime.token, args = "--simulate --hosts 5", hosts = 5 }
    local m
    finally(function() -- one for all: busted keeps only a test's last finally()
      monarch.configure{ cast_min = 16, fanout = 16 }
      if m then m:stop() end
      group:stop()
    end)
    monarch.configure{ cast_min = 2, fanout = 2 } -- 5 agents past a fan-out of 2: a tree of three levels
    local seen = {}
    for _, a in ipairs(group.addrs) do seen[a] = true end
    local n = 0
    for _ in pairs(seen) do n = n + 1 end
    assert.are.equal(5, n, "five agents, five ports")
    -- Not mesh(): its finally() would replace this test's (busted keeps only the last).
    m = mesh_mod.host_mesh(mesh_mod.connect_agents(group.addrs)):spawn_procs{ procs = 3 }
    m:load "basic"
    -- The first cast sends TREE; parents then dial their children, and casts take a link once it is up.
    local ranks, st
    local deadline = monarch.now() + 10
    repeat
      ranks = m:call("rank"):get(10):values()
      st = core.cast_stats()
      if st.routed < 1 then monarch.sleep(0.05) end
    until st.routed >= 1 or monarch.now() > deadline
    for i = 1, 15 do assert.are.same({ i - 1, 15 }, ranks[i]) end
    assert.is_true(st.links_up >= 3, "the agents' relay links to each other are up: " .. st.links_up)
    assert.is_true(st.routed >= 1, "a cast went through a parent agent in the group")
    assert.are.equal(9, m:slice{ hosts = 4, procs = 2 }:call_one("echo", 9):get(10))
    -- SIGTERM stops the whole group.
    m:stop()
    m = nil
    local pid = group.pid
    group:stop()
    local deadline = monarch.now() + 5
    while monarch.now() < deadline and os.execute("kill -0 " .. pid .. " 2>/dev/null") == 0 do monarch.sleep(0.05) end
    assert.are_not.equal(0, os.execute("kill -0 " .. pid .. " 2>/dev/null"), "the group's process exited")
  end)

  it("refuses --hosts without --simulate, with --once, or out of range, naming the option", function()
    for _, args in ipairs{ "--hosts 3", "--simulate --hosts 3 --once", "--simulate --hosts 0", "--simulate --hosts x" } do
      local f = io.popen((os.getenv("MONARCH_BUILD") or "build") .. "/bin/monarch-worker --listen 127.0.0.1:0 " ..
        args .. " 2>&1; echo rc=$?")
      local out = f:read("*a")
      f:close()
      assert.matches("rc=2", out, 1, true)
      assert.matches("--hosts", out, 1, true)
    end
  end)

  it("mixes real and simulated hosts in one mesh", function()
    real = real or agent.start{ token = runtime.token }
    local m = mesh{ real.addr, sims[2].addr }
    local procs = m:proc_list()
    assert.is_true(procs[1].port > 0)
    assert.are.equal(0, procs[5].port)
    local ranks = m:call("rank"):get(10):values()
    for i = 1, 8 do assert.are.same({ i - 1, 8 }, ranks[i]) end
    assert.are.equal("x", m:call("echo", "x"):get(10):values()[8])
    assert.are.equal(3, m:slice{ hosts = 0, procs = 0 }:call_one("echo", 3):get(10))
    assert.are.equal(4, m:slice{ hosts = 1, procs = 3 }:call_one("echo", 4):get(10))
  end)
end)
