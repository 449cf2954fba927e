-- Direct links only where they pay (issue 14): the procs of a mesh of
-- cast_min procs or more keep a direct controller link only while it is
-- used, at most direct_max at once (4 here), closed after direct_idle.
-- Real agents (procs orphaned after 1 s without a controller) and procs;
-- faulty's bump/bumps count the calls that really ran, so order and
-- exactly-once are checked on the procs themselves.
local monarch = require "monarch"
local core = require "monarch.core"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local agent = require "support.agent"
local order = require "support.order"
local ffi = require "ffi"

local sh = require("support.shell").quiet
local alive = require("support.procstat").alive
local wait_for = require("support.wait").wait_for

pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")

local CAP, PER = 4, 12

describe("direct links to the procs of a large mesh", function()
  local daemons = {}

  setup(function()
    monarch.hosts()
    for i = 1, 2 do daemons[i] = agent.start{ token = runtime.token, args = "--orphan-timeout 1" } end
  end)

  teardown(function()
    for _, d in ipairs(daemons) do d:stop() end
  end)

  local function stats() return core.cast_stats() end


  -- Whether proc p's direct link is up now (core.info's sixth value: nil for a proc that is not pooled).
  local function linked(p) return select(6, core.info(p.conn)) end

  local function fds()
    local f = io.popen("ls /proc/" .. core.bulk_self() .. "/fd | wc -l")
    local n = tonumber(f:read("*a"))
    f:close()
    return n
  end

  -- 2 agents x PER procs with a pool of CAP links (idle after `idle` s), their spawn links closed
  -- again; events collects failures. `before` runs first (inside the one finally's reach).
  local function mesh(idle, before)
    local events, m = {}, nil
    finally(function()
      if m then m:stop() end
      monarch.configure{ direct_max = 256, direct_idle = 30 }
      ffi.C.unsetenv("MONARCH_BULK_LOCAL")
    end)
    if before then before() end
    monarch.configure{ direct_max = CAP, direct_idle = idle or 30 }
    local agents = mesh_mod.connect_agents{ daemons[1].addr, daemons[2].addr }
    m = mesh_mod.host_mesh(agents):spawn_procs{ procs = PER }
    m:on_failure(function(e) events[#events + 1] = e end)
    assert.is_true(stats().direct_links <= CAP, "more links than the cap right after the spawn")
    m:load "basic"
    m:load "faulty"
    for _, p in ipairs(m:proc_list()) do assert.is_not_nil(linked(p), "a proc of a large mesh is not pooled") end
    wait_for(function() return stats().direct_links == 0 end, 3, function()
      return "the spawn's links to close: " .. stats().direct_links .. " open, " .. stats().direct_waiting .. " waiting"
    end)
    return m, events
  end

  local function one(m, rank) return m:slice{ hosts = math.floor(rank / PER), procs = rank % PER } end

  it("answers call_one on every proc with at most direct_max links open, and few file descriptors", function()
    local m, events = mesh()
    local base, most = fds(), 0
    for round = 1, 2 do
      for rank = 0, 2 * PER - 1 do
        assert.are.equal(rank, one(m, rank):call_one("rank"):get(10)[1])
        most = math.max(most, stats().direct_links)
        assert.is_true(fds() <= base + CAP + 2, "the controller holds more descriptors than the pool allows")
      end
      assert.are.equal(2 * PER, #m:call("rank"):get(10):values()) -- and mesh-wide, through the agents
    end
    local chosen = {}
    for _ = 1, 3 * PER do chosen[m:choose("rank"):get(10)[1]] = true end -- round robin over every proc
    for rank = 0, 2 * PER - 1 do assert.is_true(chosen[rank], "choose never reached rank " .. rank) end
    assert.is_true(stats().direct_links <= CAP)
    assert.is_true(most >= 1 and most <= CAP, "links open at once: " .. most)
    assert.are.same({}, events)
  end)

  it("answers mesh:ping() on more procs than direct_max: a link owed a PONG is not closed for another", function()
    local m = mesh()
    for _ = 1, 2 do
      local rtts = m:ping():get(15):values()
      assert.are.equal(2 * PER, #rtts)
      for _, rtt in ipairs(rtts) do assert.is_true(rtt >= 0, "a ping's round trip: " .. tostring(rtt)) end
    end
    assert.is_true(stats().direct_links <= CAP)
  end)

  it("opens a link on the first call_one, uses it, and closes it quietly after direct_idle", function()
    local m, events = mesh(1)
    local p = m:proc_list()[3]
    local opened, closed = stats().direct_opened, stats().direct_closed
    assert.is_false(linked(p))
    assert.are.equal(1, one(m, 2):call_one("echo", 1):get(10)) -- through its agent while the link opens
    wait_for(function() return linked(p) end, 3, "call_one to open a link")
    assert.are.equal(opened + 1, stats().direct_opened)
    for i = 1, 20 do assert.are.equal(i, one(m, 2):call_one("echo", i):get(10)) end
    wait_for(function() return not linked(p) end, 3, "the idle link to close")
    assert.are.equal(closed + 1, stats().direct_closed)
    assert.are.equal("ready", p.state) -- nothing failed, nothing reconnected
    monarch.sleep(1.5) -- past the procs' orphan timeout, with no link: their agent's relay carries the session
    assert.is_true(alive(p.pid), "a proc without its link orphaned itself")
    assert.are.equal(2, one(m, 2):call_one("echo", 2):get(10))
    assert.are.same({}, events)
  end)

  it("closes the least recently used idle link to open one more", function()
    local m, events = mesh(2) -- a link used within the last second is kept
    local procs = m:proc_list()
    for rank = 0, CAP - 1 do
      one(m, rank):call_one("noop"):get(10)
      wait_for(function() return linked(procs[rank + 1]) end, 3, "a link to proc " .. rank)
    end
    monarch.sleep(1.1)
    one(m, 0):call_one("noop"):get(10) -- the first is used again: the second is the least recently used
    one(m, CAP):call_one("noop"):get(10)
    wait_for(function() return linked(procs[CAP + 1]) end, 3, "a link for the new proc")
    assert.is_true(linked(procs[1]), "the link used last was closed")
    assert.is_false(linked(procs[2]), "the least recently used link stayed open")
    assert.is_true(stats().direct_links <= CAP)
    assert.are.same({}, events)
  end)

  it("puts and fetches a tensor over the links, a pool's worth of procs at a time", function()
    local m, events = mesh(30, function() ffi.C.setenv("MONARCH_BULK_LOCAL", "0", 1) end)
    local t = m:tensor("f32", { 256 })
    local bytes = string.rep("\0\0\128\63", 256) -- 256 x 1.0
    local puts = require("monarch.bulk").stats.tcp_puts
    t:put(bytes):get(20)
    assert.is_true(require("monarch.bulk").stats.tcp_puts > puts, "the put did not go over the links")
    assert.is_true(stats().direct_links <= CAP)
    for _, v in ipairs(m:call("sum", t):get(10):values()) do assert.are.equal(256, v) end
    local got = t:fetch():get(20):values()
    assert.are.equal(2 * PER, #got)
    assert.are.equal(1, got[2 * PER].data[255])
    assert.are.same({}, events)
  end)

  it("probes its procs for same-host copies at the first transfer, all in one call", function()
    local m, events = mesh()
    local bulk = require "monarch.bulk"
    local puts = bulk.stats.local_puts
    for _, p in ipairs(m:proc_list()) do assert.is_nil(p.bulk, "probed before any transfer") end
    local t = m:tensor("f32", { 256 })
    t:put(string.rep("\0\0\128\63", 256)):get(20)
    assert.is_true(bulk.stats.local_puts > puts, "the put did not copy on this host")
    for _, p in ipairs(m:proc_list()) do assert.is_true(p.bulk, "a proc was not probed: " .. tostring(p.bulk_why)) end
    assert.is_true(stats().direct_links <= CAP)
    for _, v in ipairs(m:call("sum", t):get(10):values()) do assert.are.equal(256, v) end
    assert.are.same({}, events)
  end)

  it("cancels a running cast on procs without a link: each CANCEL waits for one", function()
    local m, events = mesh()
    local pids = {}
    for i, p in ipairs(m:procs()) do pids[i] = p.pid end
    local f = m:call("sleep", 5)
    monarch.sleep(0.3)
    assert.are.equal(0, stats().direct_links) -- a mesh-wide call wants no link
    f:cancel()
    local t0 = monarch.now()
    assert.is_false((pcall(f.get, f)))
    assert.are.equal(2 * PER, #m:call("echo", 1):get(4):values())
    assert.is_true(monarch.now() - t0 < 3, "the procs did not stop their sleep")
    for i, p in ipairs(m:procs()) do assert.are.equal(pids[i], p.pid) end -- stopped, not killed as hung
    assert.is_true(stats().direct_links <= CAP)
    assert.are.same({}, events)
  end)

  it("hears of a killed proc from its agent, fails its calls in flight, and restarts it", function()
    local m, events = mesh()
    local r = m:options{ restart = true }
    local p, q = r:proc_list()[5], r:proc_list()[6]
    local old = p.pid
    assert.is_false(linked(p))
    -- Another proc with a call in flight on its link, killed too: the lost link is no answer, its agent's report is.
    assert.are.equal(1, one(r, 5):call_one("echo", 1):get(10))
    wait_for(function() return linked(q) end, 3, "call_one to open a link")
    local busy = one(r, 5):call_one("sleep", 5)
    monarch.sleep(0.2)
    sh("kill -9 " .. old .. " " .. q.pid)
    local ok, err = pcall(busy.get, busy, 5)
    assert.is_false(ok, "a call on a killed proc was answered")
    assert.are.equal("proc_failed", err.kind)
    wait_for(function() return #events >= 2 end, 5, "the deaths to be reported")
    table.sort(events, function(x, y) return x.rank < y.rank end)
    assert.are.equal(4, events[1].rank)
    assert.are.equal(5, events[2].rank)
    wait_for(function() return p.state == "ready" and p.pid ~= old end, 10, "the restart")
    assert.are.equal(4, one(r, 4):call_one("rank"):get(10)[1])
    assert.are.equal(2 * PER, #r:call("rank"):get(10):values())
  end)

  it("runs every call exactly once and in order while links open, close and are evicted", function()
    local m, events = mesh(0.4)
    local base = {}
    for i, v in ipairs(m:call("bumps"):get(10):values()) do base[i] = v end
    local futs, seen = {}, {}
    for i = 1, 60 do
      local rank = (i * 7) % (2 * PER)
      futs[#futs + 1] = { rank = rank, f = one(m, rank):call_one("bump") }
      if i % 6 == 0 then futs[#futs + 1] = { all = true, f = m:call("bump") } end
      if i % 20 == 0 then monarch.sleep(0.5) end -- idle links close meanwhile
    end
    order.check(futs, base, seen)
    for rank, v in ipairs(m:call("bumps"):get(10):values()) do
      assert.are.equal(seen[rank - 1] or base[rank], v, "proc " .. (rank - 1) .. " ran a call twice or not at all")
    end
    assert.is_true(stats().direct_opened > CAP, "no link was reopened")
    assert.are.same({}, events)
  end)
end)
