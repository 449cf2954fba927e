-- The cast tree (issue 14): past `fanout` host agents, a mesh-wide call goes
-- to the top agents only and each hands it down to its children. The local
-- agent (monarch.hosts()) and seven real agents with fanout 2 make three
-- levels: positions 0-1, 2-5 (children of 0 and 1) and 6-7 (children of 2,
-- which is daemons[2]). faulty's bump/bumps count the calls that really ran,
-- so order and exactly-once are checked on the procs themselves.
local monarch = require "monarch"
local core = require "monarch.core"
local mesh_mod = require "monarch.mesh"
local tree = require "support.tree_fixture"
local order = require "support.order"

local sh = require("support.shell").quiet

describe("the cast tree", function()
  local daemons = {}
  local agents, m

  setup(function() daemons, agents = tree.start() end)

  teardown(function() tree.stop(daemons) end)

  after_each(function()
    if m then m:stop() end
    m = nil
  end)

  local function mesh()
    m = mesh_mod.host_mesh(agents):spawn_procs{ procs = 2 }
    m:load "basic"
    m:load "faulty"
    -- The first cast builds the tree; the parents' links come up on their own.
    local deadline = monarch.now() + 10
    while core.cast_stats().links_up < 6 and monarch.now() < deadline do
      m:call("noop"):get(10)
      monarch.sleep(0.05)
    end
    assert.are.equal(8, core.cast_stats().tree_agents)
    assert.are.equal(6, core.cast_stats().links_up, "the six parent links did not come up")
    m:call("noop"):get(10) -- the first call after they are up takes the routes through them
    return m
  end

  local function counts()
    local out = {}
    for i, v in ipairs(m:call("bumps"):get(10):values()) do out[i] = v end
    return out
  end

  it("reaches every proc of three levels with one CAST frame per top agent", function()
    mesh()
    assert.is_true(core.cast_stats().tree)
    assert.are.equal(6, core.cast_stats().routed)
    local before = core.cast_stats()
    local ranks = m:call("rank"):get(10):values()
    for i = 1, 14 do assert.are.equal(i - 1, ranks[i][1]) end
    local after = core.cast_stats()
    assert.are.equal(2, after.casts - before.casts) -- positions 0 and 1; the other six through them
    assert.are.equal(14, after.calls - before.calls)
    assert.are.equal("x", m:call("echo", "x"):get(10):values()[14])
  end)

  it("keeps each proc's order across pipelined casts and single calls", function()
    mesh()
    local base = counts()
    local futs, seen = {}, {}
    for i = 1, 40 do
      futs[#futs + 1] = { all = true, f = m:call("bump") }
      local r = i % 14
      futs[#futs + 1] = { rank = r, f = m:slice{ hosts = math.floor(r / 2), procs = r % 2 }:call_one("bump") }
    end
    order.check(futs, base, seen)
  end)

  it("watches the agents below the top through their parents: idle, only the top ones hear PINGs", function()
    mesh()
    assert.are.equal(6, core.cast_stats().vouched)
    local p0 = core.cast_stats().agent_pings
    monarch.sleep(3) -- six heartbeats: an idle agent PINGed directly gets one a second, 24 for all eight
    local pings = core.cast_stats().agent_pings - p0
    assert.is_true(pings < 16, "the controller wrote " .. pings .. " PINGs to agents in 3 s; the top two need 6-8")
    assert.are.equal(6, core.cast_stats().vouched, "a link went down while idle")
    for i = 1, 7 do assert.are.equal("ready", agents[i].state, "agent " .. i .. " was dropped while vouched for") end
    assert.are.equal(13, m:call("rank"):get(10):values()[14][1]) -- and the tree still carries casts
  end)

  it("reports a stopped agent at the bottom of the tree within the heartbeat timeout", function()
    monarch.configure{ heartbeat_timeout = 1.5 }
    -- One finally() for both: busted keeps only a test's last one, and a timeout left at 1.5 s made
    -- agents of later specs "lost" on a slow (sanitizer) build.
    finally(function()
      sh("kill -CONT " .. daemons[6].pid)
      monarch.configure{ heartbeat_timeout = 3.0 }
    end)
    mesh()
    assert.are.equal(6, core.cast_stats().vouched)
    -- daemons[6] is position 6, a child of position 2: only its parent's link watches it.
    local t0 = monarch.now()
    sh("kill -STOP " .. daemons[6].pid)
    while agents[6].state == "ready" and monarch.now() - t0 < 10 do monarch.sleep(0.05) end
    local took = monarch.now() - t0
    assert.are_not.equal("ready", agents[6].state, "a stopped agent below the top was never reported")
    assert.is_true(took > 0.5 and took < 1.5 + 1.5, string.format("reported after %.2f s (timeout 1.5 s)", took))
    sh("kill -CONT " .. daemons[6].pid)
    local deadline = monarch.now() + 10
    while agents[6].state ~= "ready" and monarch.now() < deadline do monarch.sleep(0.05) end
    assert.are.equal("ready", agents[6].state, "the agent did not come back after SIGCONT")
  end)

  it("runs every call exactly once when a relay agent stops mid-cast", function()
    monarch.configure{ heartbeat_timeout = 1.0 }
    finally(function() monarch.configure{ heartbeat_timeout = 3.0 } end)
    mesh()
    m:on_failure(function() end)
    local base = counts()
    -- daemons[2] relays to daemons[6] and daemons[7]. Stopped, it holds casts for all three; the
    -- controller hears nothing from it for a second and resends every relayed call on the procs' own links.
    sh("kill -STOP " .. daemons[2].pid)
    local futs = {}
    for i = 1, 20 do futs[i] = m:call("bump") end
    for i = 1, 20 do
      local vals = futs[i]:get(20):values()
      for rank = 1, 14 do assert.are.equal(base[rank] + i, vals[rank][1]) end
    end
    sh("kill -CONT " .. daemons[2].pid)
    monarch.sleep(1.5)
    local now = counts()
    for rank = 1, 14 do assert.are.equal(base[rank] + 20, now[rank], "proc " .. (rank - 1) .. " ran a call twice") end
  end)

  it("runs every call exactly once below a relay agent killed mid-cast", function()
    mesh()
    m:on_failure(function() end)
    finally(monarch.on_host_loss(function() end)) -- expected: no line for it
    local base = counts()
    local futs = {}
    for i = 1, 30 do
      futs[i] = m:call("bump")
      if i == 10 then sh("kill -9 " .. daemons[2].pid) end -- the parent of daemons[6] and daemons[7]
    end
    for i = 1, 30 do pcall(futs[i].get, futs[i], 20) end
    -- Hosts 5 and 6 (daemons[6], daemons[7]), reached through the dead relay until it died, ran each call once.
    for h = 5, 6 do
      local v = m:slice{ hosts = h }:call("bumps"):get(10):values()
      for j = 1, 2 do
        assert.are.equal(base[2 * h + j] + 30, v[j], "a proc below the dead relay lost or repeated a call")
      end
    end
    local v0 = m:slice{ hosts = 0 }:call("bumps"):get(10):values()
    assert.are.equal(base[1] + 30, v0[1])
  end)
end)
