-- Spawns down the cast tree (issue 14): past `fanout` host agents, the
-- controller sends one SPAWN per top agent and each agent hands its
-- children theirs. The local agent and seven real agents with fanout 2 make
-- three levels: positions 0-1, 2-5 (children of 0 and 1) and 6-7 (children
-- of 2, which is daemons[2]). Each agent's procs are its children, so
-- `pgrep -P` counts what it really started: a spawn run twice shows there.
local monarch = require "monarch"
local core = require "monarch.core"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local tree = require "support.tree_fixture"

local sh = require("support.shell").quiet

describe("spawns through the cast tree", function()
  local daemons = {}
  local agents, m

  setup(function() daemons, agents = tree.start() end)

  teardown(function() tree.stop(daemons) end)

  after_each(function()
    if m then m:stop() end
    m = nil
  end)

  -- The procs daemons[i] runs now.
  local function children(i)
    local p = io.popen("pgrep -c -P " .. daemons[i].pid)
    local n = tonumber(p:read("*a")) or 0
    p:close()
    return n
  end

  -- Waits until daemons[i] runs n procs (an earlier mesh's take a moment to go), then checks it stays so.
  local function runs(i, n, wait)
    local deadline = monarch.now() + (wait or 10)
    while children(i) ~= n and monarch.now() < deadline do monarch.sleep(0.05) end
    monarch.sleep(0.3)
    assert.are.equal(n, children(i), "agent " .. i .. " runs " .. children(i) .. " procs, not " .. n)
  end

  it("sends one SPAWN per top agent and starts each agent's procs once", function()
    local before = core.cast_stats()
    m = mesh_mod.host_mesh(agents):spawn_procs{ procs = 2 }
    local after = core.cast_stats()
    assert.are.equal(6, after.links_wanted)
    assert.are.equal(6, after.links_up, "the spawn did not wait for the tree's links")
    -- Positions 2-7 through their parents; position 1 (daemons[1]) is a top agent, sent to directly.
    assert.are.equal(6, after.spawn_relayed - before.spawn_relayed)
    assert.are.equal(0, after.spawn_resent - before.spawn_resent)
    m:load "basic"
    local ranks = m:call("rank"):get(10):values()
    for r = 1, 14 do assert.are.equal(r - 1, ranks[r][1]) end
    for i = 1, 7 do runs(i, 2) end
  end)

  it("starts each proc once when a relay stops mid-spawn", function()
    mesh_mod.host_mesh(agents):spawn_procs{ procs = 1 }:stop() -- the tree is up
    local before = core.cast_stats()
    -- daemons[2] holds the SPAWNs of daemons[6] and daemons[7]. Its parent reports the link silent
    -- after half the heartbeat timeout and the controller sends all three directly; it is woken then,
    -- before the controller's own timeout, so that it answers the copy it was sent directly.
    sh("kill -STOP " .. daemons[2].pid)
    local woke
    local stop_watch = runtime.tick(function()
      if not woke and core.cast_stats().spawn_resent > before.spawn_resent then
        woke = true
        sh("kill -CONT " .. daemons[2].pid)
      end
    end)
    finally(function()
      stop_watch()
      sh("kill -CONT " .. daemons[2].pid)
    end)
    m = mesh_mod.host_mesh(agents):spawn_procs{ procs = 2 }
    assert.is_true(woke, "nothing was resent")
    assert.is_true(core.cast_stats().spawn_resent - before.spawn_resent >= 3)
    m:load "basic"
    local ranks = m:call("rank"):get(10):values()
    for r = 1, 14 do assert.are.equal(r - 1, ranks[r][1]) end
    -- The stopped relay and the two below it got their SPAWN twice (relayed, then directly): once run.
    for _, i in ipairs{ 2, 6, 7 } do runs(i, 2) end
  end)

  it("fails only the procs of a relay killed mid-spawn, at once", function()
    mesh_mod.host_mesh(agents):spawn_procs{ procs = 1 }:stop()
    finally(monarch.on_host_loss(function() end)) -- expected: no line for it
    sh("kill -STOP " .. daemons[2].pid) -- so that it dies holding the SPAWNs for itself and below
    local t0 = monarch.now()
    local stop_timer = runtime.at(t0 + 0.3, function() sh("kill -9 " .. daemons[2].pid) end)
    finally(stop_timer)
    local ok, err = pcall(mesh_mod.host_mesh(agents).spawn_procs, mesh_mod.host_mesh(agents), { procs = 2 })
    local took = monarch.now() - t0
    assert.is_false(ok)
    local msg = tostring(err)
    -- daemons[2] is host 1: ranks 2 and 3. Its children's procs started (their SPAWN sent again directly).
    assert.truthy(msg:find("could not start 2 of 14 procs", 1, true), msg)
    assert.truthy(msg:find("rank 2 on", 1, true) and msg:find("rank 3 on", 1, true), msg)
    assert.is_true(took < 10, string.format("the spawn took %.1f s to fail", took))
  end)

  it("starts nothing twice when a spawn is resent to agents that had it", function()
    -- daemons[2] is gone (above): the tree is rebuilt over the other seven, and daemons[5] is a leaf.
    local live = { agents[1], agents[3], agents[4], agents[5], agents[6], agents[7] }
    mesh_mod.host_mesh(live):spawn_procs{ procs = 1 }:stop()
    for _, i in ipairs{ 1, 3, 4, 6, 7 } do runs(i, 0) end
    finally(monarch.on_host_loss(function() end))
    local before = core.cast_stats()
    -- An agent lost while the SPAWNs are on their way takes every relayed one off the tree: those not
    -- answered yet go again, directly, to agents that have (or will have) the relayed copy too.
    local stop_timer = runtime.at(monarch.now(), function() sh("kill -9 " .. daemons[5].pid) end)
    finally(stop_timer)
    local ok = pcall(mesh_mod.host_mesh(live).spawn_procs, mesh_mod.host_mesh(live), { procs = 2 })
    assert.is_false(ok, "daemons[5]'s procs cannot have started")
    assert.is_true(core.cast_stats().spawn_resent > before.spawn_resent, "nothing was resent")
    -- The failed spawn killed every proc it heard of; a second copy run would have left two more.
    for _, i in ipairs{ 1, 3, 4, 6, 7 } do runs(i, 0, 3) end
  end)
end)
