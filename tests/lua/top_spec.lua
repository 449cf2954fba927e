-- monarch.top without a screen: the rates it works out from two STATUS
-- reports and the lines it draws (tests/integration/top_spec.lua runs the
-- real view in a terminal).
local top = require "monarch.top"

local function proc(t)
  local p = { rank = 0, pid = 100, state = "attached", queued = 0, executed = 0, running = "-", running_for = 0,
    uptime = 5, cpu = 1.0, rss = 8 * 2 ^ 20, status_age = 0, hung = false, ready = true }
  for k, v in pairs(t or {}) do p[k] = v end
  return p
end

local function report(procs, exits)
  return { hostname = "node1", pid = 42, uptime = 65, procs = procs, exits = exits or {} }
end

local function text(lines)
  local out = {}
  for i, l in ipairs(lines) do out[i] = l[1] end
  return table.concat(out, "\n")
end

-- A view of one host that answered twice, one second apart.
local function answered(procs1, procs2, exits)
  local a = { addr = "10.0.0.1", port = 7450, state = "ready" }
  local v = top.new({ a })
  top.took(v.hosts[1], report(procs1), 10)
  top.took(v.hosts[1], report(procs2, exits), 11)
  return v
end

describe("monarch.top formatting", function()
  it("writes durations and sizes short", function()
    assert.are.equal("0.4s", top.duration(0.4))
    assert.are.equal("42s", top.duration(42))
    assert.are.equal("3m07s", top.duration(187))
    assert.are.equal("2h05m", top.duration(7500))
    assert.are.equal("-", top.duration(nil))
    assert.are.equal("512B", top.bytes(512))
    assert.are.equal("1.5K", top.bytes(1536))
    assert.are.equal("3.0G", top.bytes(3 * 2 ^ 30))
    assert.are.equal("-", top.bytes(nil))
  end)
end)

describe("monarch.top rates", function()
  it("has none from a single report", function()
    local s = top.sample(nil, proc { executed = 10 }, 5)
    assert.is_nil(s.rate)
    assert.is_nil(s.cpu_pct)
  end)

  it("times calls by the procs' status lines and CPU by the reports", function()
    local s1 = top.sample(nil, proc { executed = 100, status_age = 0.5, cpu = 2.0 }, 10)
    local s2 = top.sample(s1, proc { executed = 400, status_age = 0.25, cpu = 2.5 }, 11)
    assert.are.near(300 / 1.25, s2.rate, 1e-9) -- the lines were 1.25 s apart
    assert.are.near(50, s2.cpu_pct, 1e-9)
  end)

  it("keeps the base when no new status line came between two reports", function()
    local s1 = top.sample(nil, proc { executed = 100, status_age = 0 }, 10)
    local s2 = top.sample(s1, proc { executed = 200, status_age = 0 }, 11)
    local s3 = top.sample(s2, proc { executed = 200, status_age = 1 }, 12) -- the same line as at 11
    assert.are.equal(100, s2.rate)
    assert.are.equal(100, s3.rate)
    local s4 = top.sample(s3, proc { executed = 500, status_age = 0 }, 13)
    assert.are.equal(150, s4.rate) -- 300 calls since the line at 11, 2 s before
  end)
end)

describe("monarch.top columns", function()
  local function names(cols)
    local out = {}
    for i, c in ipairs(cols) do out[i] = c[1] end
    return table.concat(out, " ")
  end

  it("shows every column on a wide terminal", function()
    assert.are.equal("RANK PID STATE CALLS/S QUEUE RUNNING FOR CPU% RSS GPU MEM UPTIME HELD", names(top.columns(160)))
  end)

  it("drops the least needed first on a narrow one, keeping the order", function()
    assert.are.equal("RANK STATE CALLS/S QUEUE RUNNING FOR CPU% RSS GPU MEM", names(top.columns(80)))
    assert.are.equal("RANK STATE CALLS/S QUEUE RUNNING FOR", names(top.columns(60)))
  end)
end)

describe("monarch.top lines", function()
  it("shows each proc with its rate, kernel and memory, and the host's failures", function()
    local v = answered({ proc { executed = 0 }, proc { rank = 1, pid = 101, running = "sleep", running_for = 3 } },
      { proc { executed = 500 }, proc { rank = 1, pid = 101, running = "sleep", running_for = 4, gpu_mem = 2 ^ 30 } },
      { { rank = 2, pid = 102, status = 0, signal = "KILL", ago = 1.5 }, { rank = 3, pid = 103, status = 0, signal = "", ago = 2 } })
    local s = text(top.lines(v, 11, 40, 160))
    assert.matches("monarch top  %d%d:%d%d:%d%d  1 hosts  2 procs  500 calls/s", s)
    assert.matches("host node1 %(10%.0%.0%.1:7450%)  agent pid 42  up 1m05s  2 procs  500 calls/s", s)
    assert.matches("\n +0 +100 ready +500 +0 %- +%- +0 +8%.0M +%- +5%.0s attached", s)
    assert.matches("\n +1 +101 ready +0%.0 +0 sleep +4%.0s +0 +8%.0M +1%.0G", s)
    assert.matches("failed: rank 2 pid 102 killed by SIGKILL, 1.5s ago", s, 1, true)
    assert.is_nil(s:find("rank 3 pid 103", 1, true), "a clean exit is not a failure")
  end)

  it("marks a hung proc and this controller's own", function()
    local v = answered({ proc {} }, { proc { hung = true, mine = true } })
    local lines = top.lines(v, 11, 40, 160)
    local row = lines[4]
    assert.matches("hung", row[1])
    assert.matches("attached%*$", row[1])
    assert.are.equal("bad", row[2])
  end)

  it("shows a host that is lost, reconnecting or silent as unreachable", function()
    local lost = { addr = "10.0.0.2", port = 1, state = "dead", reason = "connection refused" }
    local away = { addr = "10.0.0.3", port = 2, state = "reconnecting", reason = "no heartbeat" }
    local quiet = { addr = "10.0.0.4", port = 3, state = "ready" }
    local v = top.new({ lost, away, quiet })
    v.hosts[3].req, v.hosts[3].sent_at = { done = false }, 0
    local s = text(top.lines(v, 5, 40, 160))
    assert.matches("10.0.0.2:1  unreachable: connection refused", s, 1, true)
    assert.matches("10.0.0.3:2  unreachable: reconnecting (no heartbeat)", s, 1, true)
    assert.matches("10.0.0.4:3  unreachable: no answer for 5.0s", s, 1, true)
    assert.matches("3 hosts  0 procs", s, 1, true)
  end)

  it("says when the terminal is too small", function()
    local v = answered({ proc {} }, { proc {} })
    local lines = top.lines(v, 11, 4, 100)
    assert.are.equal(1, #lines)
    assert.are.equal("terminal too small (100x4): top needs 60x5", lines[1][1])
  end)

  it("scrolls what does not fit, within bounds", function()
    local many = {}
    for r = 0, 29 do many[#many + 1] = proc { rank = r, pid = 1000 + r } end
    local v = answered(many, many)
    local lines = top.lines(v, 11, 10, 160)
    assert.are.equal(10, #lines)
    assert.are.equal("-- lines 1-7 of 31: arrows and PgUp/PgDn scroll --", lines[10][1])
    assert.is_true(top.scroll(v, "pgdn"))
    lines = top.lines(v, 11, 10, 160)
    assert.are.equal("-- lines 7-13 of 31: arrows and PgUp/PgDn scroll --", lines[10][1])
    top.scroll(v, "end")
    lines = top.lines(v, 11, 10, 160)
    assert.are.equal("-- lines 25-31 of 31: arrows and PgUp/PgDn scroll --", lines[10][1])
    top.scroll(v, "home")
    top.scroll(v, "up")
    assert.are.equal(0, v.offset)
    assert.is_false(top.scroll(v, "x"))
  end)
end)

describe("monarch.top rounds", function()
  local procs_mod = require "monarch.procs"
  local persist = require "monarch.persist"

  before_each(function()
    stub(procs_mod, "connect_agent")
    stub(persist, "request", function(a) return { conn = a.conn, agent = a } end)
    stub(persist, "forget")
  end)

  after_each(function()
    procs_mod.connect_agent:revert()
    persist.request:revert()
    persist.forget:revert()
  end)

  it("asks a host again only once it answered", function()
    local a = { addr = "h", port = 1, state = "ready", conn = 7 }
    local v = top.new({ a })
    top.round(v, 0)
    top.round(v, 1)
    assert.stub(persist.request).was.called(1)
    v.hosts[1].req.done, v.hosts[1].req.ok, v.hosts[1].req.value = true, true, report({ proc {} })
    assert.is_true(top.collect(v, 1.5))
    top.round(v, 2)
    assert.stub(persist.request).was.called(2)
  end)

  it("drops the question to a host that was lost, and reconnects every RETRY seconds with retry", function()
    local a = { addr = "h", port = 1, state = "ready", conn = 7 }
    local v = top.new({ a }, { retry = true })
    top.round(v, 0)
    a.state = "dead"
    top.round(v, 1)
    assert.stub(persist.forget).was.called(1)
    assert.is_nil(v.hosts[1].req)
    top.round(v, 2)
    top.round(v, 1 + top.RETRY)
    assert.stub(procs_mod.connect_agent).was.called(2)
    local quiet = top.new({ { addr = "g", port = 2, state = "dead" } })
    top.round(quiet, 0)
    assert.stub(procs_mod.connect_agent).was.called(2) -- without retry: never
  end)
end)
