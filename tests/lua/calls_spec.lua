-- monarch.calls, the policies of a call in flight (retries, re-routing,
-- queueing, cancellation, deadlines, the transactional submit), against a
-- fake monarch.core and a fake clock: no cluster, no real time.
require "monarch"

-- The fake core: records what would go on the wire; each call can be told to skip or fail slots.
local function fake_core()
  local c = { sent = {}, cancels = {}, oldest_of = {}, inflight_of = {}, raise = nil, skip = nil, oom_from = nil }
  function c.call(id, targets, kernel, ...)
    if c.raise then error(c.raise, 0) end
    local list = type(targets) == "number" and { targets } or targets
    for slot, conn in ipairs(list) do c.sent[#c.sent + 1] = { id = id, conn = conn, slot = slot, kernel = kernel, args = { ... } } end
    return c.depth or 1, c.skip, c.oom_from
  end
  function c.call_as(id, conn, slot, kernel, ...)
    if c.raise then error(c.raise, 0) end
    if c.closed and c.closed[conn] then return nil, "closed" end
    c.sent[#c.sent + 1] = { id = id, conn = conn, slot = slot, kernel = kernel, args = { ... } }
    return 1
  end
  function c.check_call() if c.raise then error(c.raise, 0) end end
  function c.collect() return false end
  function c.uncollect() end
  function c.cancel(conn, id)
    c.cancels[#c.cancels + 1] = { conn = conn, id = id }
    return 1
  end
  function c.oldest(conn) return c.oldest_of[conn] end
  function c.inflight(conn) return c.inflight_of[conn] or 0 end
  return c
end

-- The fake clock and timers calls.lua schedules on (monarch.tasks' at and now).
local function fake_tasks()
  local t = { clock = 100, timers = {} }
  function t.now() return t.clock end
  function t.at(at, fn)
    local e = { at = at, fn = fn }
    t.timers[#t.timers + 1] = e
    return function() e.fn = nil end
  end
  -- Moves the clock on by dt, running each timer due on the way, earliest first.
  function t.advance(dt)
    local stop = t.clock + dt
    while true do
      table.sort(t.timers, function(a, b) return a.at < b.at end)
      local e = t.timers[1]
      if not e or e.at > stop then break end
      table.remove(t.timers, 1)
      t.clock = math.max(t.clock, e.at)
      if e.fn then e.fn() end
    end
    t.clock = stop
  end
  return t
end

-- A fresh monarch.calls bound to the fakes (the real one stays as it is for the other specs).
local function load_calls(core, tasks)
  local names = { "monarch.core", "monarch.tasks", "monarch.calls" }
  local saved = {}
  for _, n in ipairs(names) do saved[n] = package.loaded[n] end
  package.loaded["monarch.core"], package.loaded["monarch.tasks"], package.loaded["monarch.calls"] = core, tasks, nil
  local ok, calls = pcall(require, "monarch.calls")
  for _, n in ipairs(names) do package.loaded[n] = saved[n] end
  assert(ok, calls)
  return calls
end

local function procs_of(n)
  local ps = {}
  for i = 1, n do ps[i] = { rank = i - 1, host = "h", pid = 1000 + i, conn = 10 + i, state = "ready" } end
  return ps
end

local function failure(kind) return require("monarch.errors").new { kind = kind, message = kind } end

describe("monarch.calls", function()
  local core, tasks, calls, loop

  before_each(function()
    core, tasks = fake_core(), fake_tasks()
    calls = load_calls(core, tasks)
    loop = { window = 4096, unhandled_errs = {}, pumps = 0 }
    function loop.unhandled(e) loop.unhandled_errs[#loop.unhandled_errs + 1] = e end
    function loop.pump() loop.pumps = loop.pumps + 1; core.inflight_of = {} end
    calls.set_loop(loop)
  end)

  local function submit(procs, opts, ...)
    return calls.submit(procs, "k", { ... }, select("#", ...), opts or {})
  end

  it("sends a call to every ready proc at once and resolves with every slot's value", function()
    local ps = procs_of(3)
    local rec = submit(ps, { make_result = function(v, n) return { n = n, v[1], v[2], v[3] } end }, 7)
    assert.are.equal(3, #core.sent)
    assert.are.same({ 11, 12, 13 }, { core.sent[1].conn, core.sent[2].conn, core.sent[3].conn })
    assert.are.same({ 7 }, core.sent[1].args)
    for slot = 3, 1, -1 do calls.slot_done(rec, slot, true, slot * 10) end
    local ok, v = rec.future:result()
    assert.is_true(ok)
    assert.are.same({ n = 3, 10, 20, 30 }, v)
    assert.are.equal(0, calls.count())
  end)

  it("registers nothing when the arguments cannot be sent, on either path", function()
    core.raise = "call 'k': argument 1: a function cannot be sent to a proc"
    assert.has_error(function() submit(procs_of(3), {}, print) end, core.raise)
    local ps = procs_of(3)
    ps[2].state = "restarting" -- the per-slot path
    assert.has_error(function() submit(ps, {}, print) end, core.raise)
    assert.are.equal(0, calls.count())
    assert.is_nil(ps[2].queue, "a slot was queued before the raise")
  end)

  it("fails the slots core.call did not queue: closed ones as proc_failed, the rest for memory", function()
    core.skip, core.oom_from = { 2 }, 4
    local rec = submit(procs_of(5), {})
    for _, slot in ipairs { 1, 3 } do calls.slot_done(rec, slot, true, slot) end
    local ok, err = rec.future:result()
    assert.is_false(ok)
    assert.are.equal("proc_failed", err.kind) -- rank 1 (slot 2) is the lowest failed
    assert.are.equal(1, err.rank)
    assert.are.equal(2, err.others)
    assert.are.same({ "proc_failed", "memory", "memory" },
      { err.failures[1].kind, err.failures[2].kind, err.failures[3].kind })
    assert.are.equal(0, calls.count())
  end)

  it("fails a slot whose connection call_as finds closed, without raising", function()
    local ps = procs_of(2)
    ps[1].state = "restarting"
    core.closed = { [12] = true }
    local rec = submit(ps, {})
    assert.are.equal(1, #ps[1].queue) -- slot 1 waits for its proc
    ps[1].state = "ready"
    calls.flush_queue(ps[1])
    calls.slot_done(rec, 1, true, "a")
    local ok, err = rec.future:result()
    assert.is_false(ok)
    assert.are.equal("proc_failed", err.kind)
    assert.matches("connection closed before the call was sent", err.message, 1, true)
  end)

  it("retries a slot whose proc failed, after a backoff that doubles, then gives up", function()
    local ps = procs_of(2)
    local rec = submit(ps, { retries = 2, backoff = 0.1 })
    calls.slot_done(rec, 1, true, "ok")
    calls.slot_done(rec, 2, false, failure("proc_failed"))
    assert.are.equal(2, #core.sent) -- nothing resent before the backoff
    tasks.advance(0.09)
    assert.are.equal(2, #core.sent)
    tasks.advance(0.02)
    assert.are.equal(3, #core.sent)
    assert.are.same({ conn = 12, slot = 2 }, { conn = core.sent[3].conn, slot = core.sent[3].slot })
    calls.slot_done(rec, 2, false, failure("lost"))
    tasks.advance(0.15)
    assert.are.equal(3, #core.sent) -- the second backoff is 0.2 s
    tasks.advance(0.06)
    assert.are.equal(4, #core.sent)
    calls.slot_done(rec, 2, false, failure("proc_failed"))
    local ok, err = rec.future:result()
    assert.is_false(ok)
    assert.are.equal("proc_failed", err.kind)
    assert.are.equal(0, calls.count())
  end)

  it("does not retry a failure of the call itself", function()
    local rec = submit(procs_of(1), { retries = 3, backoff = 0.1 })
    calls.slot_done(rec, 1, false, failure("kernel"))
    tasks.advance(1)
    assert.are.equal(1, #core.sent)
    assert.is_false((rec.future:result()))
  end)

  it("re-routes a failed slot to another live proc of choose_from, leaving the caller's list alone", function()
    local ps = procs_of(3)
    local target = { ps[1] }
    ps[2].state = "dead"
    local rec = submit(target, { mode = "one", choose_from = ps })
    calls.slot_done(rec, 1, false, failure("unresponsive"))
    assert.are.equal(2, #core.sent)
    assert.are.equal(13, core.sent[2].conn) -- the dead rank 1 is passed over
    assert.are.equal(ps[1], target[1])
    calls.slot_done(rec, 1, true, "from rank 2")
    assert.are.same({ true, "from rank 2" }, { rec.future:result() })
  end)

  it("cancels: fails the call at once, asks its procs to stop, and drops late answers", function()
    local ps = procs_of(2)
    local rec = submit(ps, {})
    calls.cancel(rec, failure("cancelled"))
    local ok, err = rec.future:result()
    assert.is_false(ok)
    assert.are.equal("cancelled", err.kind)
    assert.are.same({ 11, 12 }, { core.cancels[1].conn, core.cancels[2].conn })
    assert.are.equal(1, calls.count()) -- kept until the late answers settle it
    calls.slot_done(rec, 1, true, 1)
    calls.slot_done(rec, 2, false, failure("proc_failed"))
    assert.are.equal(0, calls.count())
    assert.are.equal(2, #core.sent) -- the late failure was not retried
  end)

  it("calls the on_hung hooks when a cancelled call still runs on its proc past its grace", function()
    local ps = procs_of(1)
    local hung = {}
    table.insert(calls.hooks.on_hung, function(p, kernel, grace) hung[#hung + 1] = { p = p, kernel = kernel, grace = grace } end)
    local rec = submit(ps, { cancel_grace = 1 })
    core.oldest_of[11] = rec.id
    calls.cancel(rec, failure("cancelled"))
    tasks.advance(0.9)
    assert.are.equal(0, #hung)
    tasks.advance(0.5)
    assert.are.equal(1, #hung)
    assert.are.same({ ps[1], "k", 1 }, { hung[1].p, hung[1].kernel, hung[1].grace })
  end)

  it("times a call out at its deadline, naming the first slot not answered", function()
    local ps = procs_of(3)
    local rec = submit(ps, { timeout = 2 })
    calls.slot_done(rec, 1, true, 1)
    assert.are.equal(102, calls.next_deadline())
    calls.check_deadlines(101.9)
    assert.is_false(rec.future:done())
    calls.check_deadlines(102)
    local ok, err = rec.future:result()
    assert.is_false(ok)
    assert.are.equal("timeout", err.kind)
    assert.are.equal(1, err.rank)
    assert.is_nil(calls.next_deadline())
  end)

  it("queues the slots of a restarting proc and sends them in order when it is back", function()
    local ps = procs_of(1)
    ps[1].state = "restarting"
    local a = submit(ps, {})
    local b = submit(ps, {})
    assert.are.equal(0, #core.sent)
    ps[1].state = "ready"
    calls.flush_queue(ps[1])
    assert.are.same({ a.id, b.id }, { core.sent[1].id, core.sent[2].id })
  end)

  it("reports a broadcast's failure to the loop instead of a future", function()
    local rec = submit(procs_of(2), { mode = "broadcast" })
    assert.is_nil(rec.future)
    calls.slot_done(rec, 1, true)
    calls.slot_done(rec, 2, false, failure("kernel"))
    assert.are.equal(1, #loop.unhandled_errs)
    assert.are.equal("kernel", loop.unhandled_errs[1].kind)
  end)

  it("waits on the loop while a target's queue is past the window", function()
    loop.window = 10
    core.depth = 11
    core.inflight_of = { [11] = 11 }
    submit(procs_of(1), {})
    assert.are.equal(1, loop.pumps)
  end)
end)
