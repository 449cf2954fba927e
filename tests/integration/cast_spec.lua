-- Casts through host agents (issue 14): a mesh-wide call of `cast_min` or
-- more procs (16 by default; 8 here) reaches each host agent as one CAST
-- frame and comes back as batched RESULTS. Real agents and procs; faulty's bump/bumps count the calls that
-- really ran, so order and exactly-once are checked on the procs themselves.
local monarch = require "monarch"
local core = require "monarch.core"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local agent = require "support.agent"
local order = require "support.order"

local sh = require("support.shell").quiet

describe("casts through host agents", function()
  local daemons = {}

  setup(function()
    monarch.hosts()
    monarch.configure{ cast_min = 8 }
    for i = 1, 2 do daemons[i] = agent.start{ token = runtime.token } end
  end)

  teardown(function()
    monarch.configure{ cast_min = 16 }
    for _, d in ipairs(daemons) do
      sh("kill -CONT " .. (d.pid or 0))
      d:stop()
    end
  end)

  -- 2 agents x 4 procs: 8 procs, so mesh-wide calls are cast (cast_min 8); slices of fewer go directly.
  local function mesh()
    local agents = mesh_mod.connect_agents{ daemons[1].addr, daemons[2].addr }
    local m = mesh_mod.host_mesh(agents):spawn_procs{ procs = 4 }
    finally(function() m:stop() end)
    m:load "basic"
    m:load "faulty"
    return m
  end

  local function counts(m)
    local out = {}
    for i, v in ipairs(m:call("bumps"):get():values()) do out[i] = v end
    return out
  end

  it("answers a mesh-wide call on every proc, one CAST frame per host", function()
    local m = mesh()
    -- 8 procs are pooled: their spawn links close at the next heartbeat, and a call to one goes through
    -- its agent while its link (re)opens. A first call opens host 0's links; the one counted uses them.
    m:slice{ hosts = 0 }:call("rank"):get()
    local function linked()
      for i = 1, 4 do
        if select(6, core.info(m:proc_list()[i].conn)) ~= true then return false end
      end
      return true
    end
    local deadline = monarch.now() + 10
    while not linked() and monarch.now() < deadline do monarch.sleep(0.02) end
    assert.is_true(linked(), "host 0's procs' links did not come up")
    local before0 = core.cast_stats()
    m:slice{ hosts = 0 }:call("rank"):get() -- 4 procs: fewer than cast_min, straight to each
    assert.are.equal(before0.casts, core.cast_stats().casts)
    local before = core.cast_stats()
    local ranks = m:call("rank"):get():values()
    for i = 1, 8 do assert.are.equal(i - 1, ranks[i][1]) end
    local after = core.cast_stats()
    assert.are.equal(2, after.casts - before.casts) -- one frame per agent, not one per proc
    assert.are.equal(8, after.calls - before.calls)
    -- Values of every shape come back through the batch: a tensor, a string, nil.
    local t = m:tensor("f32", { 256 })
    m:call("fill", t, 0.25)
    assert.are.same({ 64, 64, 64, 64, 64, 64, 64, 64 }, m:call("sum", t):get():values())
    assert.are.equal("x", m:call("echo", "x"):get():values()[8])
  end)

  it("casts to a list whose hosts alternate: each agent's triples gathered apart, every slot its own answer", function()
    local m = mesh()
    -- Host 0's and host 1's procs one after the other: every entry breaks the other agent's run.
    local list = {}
    for i = 1, 4 do
      list[#list + 1] = m:proc_list()[4 + i]
      list[#list + 1] = m:proc_list()[i]
    end
    local before = core.cast_stats()
    local rec = runtime.submit(list, "rank", {}, 0, { make_result = function(values, n) return { values = values, n = n } end })
    local got = rec.future:get(10)
    assert.are.equal(8, got.n)
    for j, p in ipairs(list) do assert.are.equal(p.rank, got.values[j][1]) end
    local after = core.cast_stats()
    assert.are.equal(2, after.casts - before.casts) -- still one frame per agent
    assert.are.equal(8, after.calls - before.calls)
    -- And a mesh-wide call right after, in host order, still lands each answer in its slot.
    local ranks = m:call("rank"):get(10):values()
    for i = 1, 8 do assert.are.equal(i - 1, ranks[i][1]) end
  end)

  it("keeps each proc's order across casts, calls to one proc and puts", function()
    local m = mesh()
    local base = counts(m)
    local futs, seen = {}, {}
    local t = m:tensor("f32", { 4 })
    for i = 1, 30 do
      futs[#futs + 1] = { all = true, f = m:call("bump") }
      local r = i % 8
      futs[#futs + 1] = { rank = r, f = m:slice{ hosts = math.floor(r / 4), procs = r % 4 }:call_one("bump") }
      if i % 10 == 0 then t:put(string.rep("\0\0\128\63", 4)):get(10) end -- waits for the casts before it
    end
    -- Every proc saw its bumps in submission order: the values it returned rise by one each time.
    order.check(futs, base, seen)
    assert.are.same({ 4, 4, 4, 4, 4, 4, 4, 4 }, m:call("sum", t):get():values())
  end)

  it("runs every call exactly once when an agent stops mid-cast: its procs are reached directly", function()
    monarch.configure{ heartbeat_timeout = 1.0 }
    finally(function() monarch.configure{ heartbeat_timeout = 3.0 } end)
    local m = mesh()
    m:on_failure(function() end)
    local base = counts(m)
    -- The agent stops with casts in its socket; the controller hears nothing from it for a second,
    -- resends them on each proc's own link, and the procs run them there.
    sh("kill -STOP " .. daemons[1].pid)
    local futs = {}
    for i = 1, 20 do futs[i] = m:call("bump") end
    for i = 1, 20 do
      local vals = futs[i]:get(15):values()
      for rank = 1, 8 do assert.are.equal(base[rank] + i, vals[rank][1]) end
    end
    -- Back: it relays the stale casts, the procs answer them from their replay caches, nothing runs twice.
    sh("kill -CONT " .. daemons[1].pid)
    monarch.sleep(1.5)
    local now = counts(m)
    for rank = 1, 8 do assert.are.equal(base[rank] + 20, now[rank], "proc " .. (rank - 1) .. " ran a call twice") end
    assert.are.equal(3, m:slice{ hosts = 0, procs = 1 }:call_one("echo", 3):get(10))
  end)

  it("fails only the slot of a proc killed mid-cast; the others answer through the batch", function()
    local m = mesh()
    local victim = m:procs()[6]
    m:on_failure(function() end)
    local f = m:call("sleep", 0.5)
    sh("kill -9 " .. victim.pid)
    local ok, err = pcall(f.get, f, 10)
    assert.is_false(ok)
    assert.are.equal("proc_failed", err.kind)
    assert.are.equal(5, err.rank)
    assert.are.equal(0, err.others)
  end)
end)
