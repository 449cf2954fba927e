-- Stopping work (issue 19): fut:cancel(), a call timeout that cancels, the
-- cancel grace after which a proc that ignores a cancel is killed, and
-- cancelled collectives, against real procs. faulty's bump/bumps count the
-- calls that really ran (exactly-once); basic's sleep polls mk_cancelled
-- every 10 ms; faulty's spin and hang never do.
local monarch = require "monarch"
local errors = require "monarch.errors"
local collective = require "monarch.collective"

-- The error fn raises (it must raise).
local function fails(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return err
end

-- The kind of the error f:get() raises; f must fail.
local function kind_of(f)
  local err = fails(f.get, f)
  assert.is_true(errors.is(err), "not a MonarchError: " .. tostring(err))
  return err.kind, err
end

local procstat = require "support.procstat"
local alive = procstat.alive
local wait_for = require("support.wait").wait_for

local function since(t0) return monarch.now() - t0 end

-- f's value, waiting at most `limit` seconds (a call stuck behind a kernel
-- that was not stopped fails the spec at once instead of waiting it out).
local function answer(f, limit, what)
  local ok, v = pcall(f.get, f, limit)
  if not ok and errors.is(v) and v.kind == "timeout" and tostring(v.message):find("get timeout", 1, true) then
    error(string.format("%s: no answer within %g s", what or "the call", limit), 2)
  end
  if not ok then error(v, 0) end
  return v
end

local function quick(took, limit, what)
  assert.is_true(took < limit, string.format("%s after %.3f s (want < %g s)", what, took, limit))
end

-- A fresh file for faulty's mark, removed when the spec ends, and a function that waits until n procs
-- have marked it: queued just before a call, the mark says the proc's executor has reached that call
-- (the call is running, or about to be: nothing else is queued between them), where a sleep would guess.
local function marker()
  local path = os.tmpname()
  finally(function() os.remove(path) end)
  local function reached(n)
    wait_for(function()
      local f = io.open(path, "rb")
      local lines = f and select(2, f:read("*a"):gsub("\n", "")) or 0
      if f then f:close() end
      return lines >= n
    end, 10, n .. " proc(s) to reach the call after the mark")
  end
  return path, reached
end

-- n procs with basic and faulty loaded, stopped when the spec ends (passed or not).
-- Failures are recorded in the returned list, so none stops the suite.
local function mesh(n)
  local m = monarch.hosts():spawn_procs{ procs = n or 1 }
  finally(function() m:stop() end)
  m:load "basic"
  m:load "faulty"
  local events = {}
  m:on_failure(function(e) events[#events + 1] = e end)
  return m, events
end

-- A failure event's text (message and cause), lowercased.
local function said(e) return (tostring(e.message) .. " " .. tostring(e.cause)):lower() end

describe("cancelling a call", function()
  setup(function() monarch.hosts() end)

  it("frees a proc from a sleep(5) within half a second of its 0.2 s timeout, which get raises as kind timeout", function()
    local m = mesh(1)
    local pid = m:procs()[1].pid
    local t0 = monarch.now()
    local f = m:options{ timeout = 0.2 }:call_one("sleep", 5)
    assert.are.equal("timeout", (kind_of(f)))
    local fired = monarch.now()
    quick(fired - t0, 1, "the 0.2 s timeout fired")
    assert.are.equal(7, answer(m:call_one("echo", 7), 2, "the next call"))
    quick(since(fired), 0.5, "the proc answered the next call") -- the sleep would hold it 4.8 s more
    assert.are.equal(pid, m:procs()[1].pid) -- freed by the cancel, not by a kill
  end)

  it("fails a running sleep's future at once with kind cancelled; the proc answers the next call promptly", function()
    local m = mesh(1)
    local pid = m:procs()[1].pid
    local mark, reached = marker()
    m:call_one("mark", mark)
    local f = m:call_one("sleep", 5)
    reached(1)
    assert.is_false(f:done())
    local t0 = monarch.now()
    f:cancel()
    assert.is_true(f:done(), "cancel() did not fail the future at once")
    local kind, err = kind_of(f)
    assert.are.equal("cancelled", kind)
    assert.are.equal("cancelled", err.kind)
    f:cancel() -- cancelling it again changes nothing
    assert.are.equal("cancelled", (kind_of(f)))
    assert.are.equal(7, answer(m:call_one("echo", 7), 2, "the next call"))
    quick(since(t0), 0.5, "the proc answered the next call")
    assert.are.equal(pid, m:procs()[1].pid)
  end)

  it("leaves a done future as it was: its value, or its own error", function()
    local m = mesh(1)
    local f = m:call_one("echo", 3)
    assert.are.equal(3, f:get())
    f:cancel()
    assert.are.equal(3, f:get())
    local ok, v = f:result()
    assert.is_true(ok)
    assert.are.equal(3, v)
    local g = m:call_one("fail", "its own error")
    assert.are.equal("kernel", (kind_of(g)))
    g:cancel()
    local kind, err = kind_of(g)
    assert.are.equal("kernel", kind)
    assert.are.equal("its own error", err.message)
    local vm = m:call("echo", 5)
    assert.are.same({ 5 }, vm:get():values())
    vm:cancel()
    assert.are.same({ 5 }, vm:get():values())
  end)

  it("drops a call queued behind another before it runs, and never runs it later (bumps stays 0)", function()
    local m = mesh(1)
    local mark, reached = marker()
    local t0 = monarch.now()
    m:call_one("mark", mark)
    local s = m:call_one("sleep", 1)
    local early = m:call_one("bump") -- cancelled before the loop even sent it
    local queued = m:call_one("bump") -- cancelled once it waits in the proc's queue
    early:cancel()
    reached(1) -- the sleep runs, the bump sent right behind it waits in the queue
    queued:cancel()
    local control = m:call_one("bump") -- not cancelled: it counts
    assert.are.equal("cancelled", (kind_of(early)))
    assert.are.equal("cancelled", (kind_of(queued)))
    assert.is_nil(s:get()) -- the running sleep was not the one cancelled: it ran to its end
    assert.is_true(since(t0) >= 0.95, "the sleep ended early, after " .. since(t0) .. " s")
    local v = control:get()
    assert.are.equal(1, v[1], "a cancelled bump ran before the control bump")
    -- The proc runs its calls in order: a cancelled bump that ran would have run before this one.
    assert.are.equal(1, m:call_one("bumps"):get(), "a cancelled bump ran after all")
  end)

  it("cancels a ValueMesh future on every proc: the running sleeps stop, the queued bumps never run", function()
    local m = mesh(3)
    local pids = {}
    for i, p in ipairs(m:procs()) do pids[i] = p.pid end
    local mark, reached = marker()
    m:call("mark", mark)
    local f = m:call("sleep", 5)
    local g = m:call("bump")
    reached(3)
    local t0 = monarch.now()
    f:cancel()
    g:cancel()
    assert.is_true(f:done() and g:done(), "cancel() did not fail the futures at once")
    assert.are.equal("cancelled", (kind_of(f)))
    assert.are.equal("cancelled", (kind_of(g)))
    assert.are.same({ 7, 7, 7 }, answer(m:call("echo", 7), 2, "the next call"):values())
    quick(since(t0), 0.5, "every proc answered the next call")
    assert.are.same({ 0, 0, 0 }, m:call("bumps"):get():values())
    for i, p in ipairs(m:procs()) do assert.are.equal(pids[i], p.pid) end
  end)

  it("cancels a choose future on the proc it chose", function()
    local m = mesh(2)
    local mark, reached = marker()
    m:call("mark", mark) -- on both procs: whichever choose picks reaches the sleep after its mark
    local f = m:choose("sleep", 5)
    reached(2)
    local t0 = monarch.now()
    f:cancel()
    assert.are.equal("cancelled", (kind_of(f)))
    assert.are.same({ 7, 7 }, answer(m:call("echo", 7), 2, "the next call"):values())
    quick(since(t0), 0.5, "both procs answered the next call")
  end)

  it("does not kill a proc whose kernel stopped when cancelled, once the grace is over", function()
    local m, events = mesh(1)
    local pid = m:procs()[1].pid
    local mark, reached = marker()
    m:call_one("mark", mark)
    local f = m:options{ cancel_grace = 0.3 }:call_one("sleep", 5)
    reached(1)
    f:cancel()
    monarch.sleep(0.8) -- what is tested: a time well past the grace with no kill
    assert.are.equal(0, #events, #events > 0 and tostring(events[1].message) or "")
    assert.are.equal(pid, m:procs()[1].pid)
    assert.are.equal("ready", m:procs()[1].state)
    assert.is_true(alive(pid))
    assert.are.equal(7, m:call_one("echo", 7):get())
  end)
end)

describe("cancelling an actor endpoint", function()
  local path

  setup(function()
    path = os.tmpname() .. "_waiter.lua"
    local f = assert(io.open(path, "wb"))
    f:write([[
local W = {}
W.__index = W
function W.new() return setmetatable({ polls = 0 }, W) end
-- Spins until the controller asks it to stop; says how it ended. Creates the file `mark` first, for
-- the spec to see that it runs.
function W:wait_for_cancel(limit, mark)
  assert(io.open(mark, "wb")):close()
  local t0 = os.clock()
  while not proc.cancelled() do
    self.polls = self.polls + 1
    if os.clock() - t0 > limit then return "not cancelled" end
  end
  return "saw the cancel"
end
function W:polls_done() return self.polls end
return W
]])
    f:close()
  end)

  teardown(function() os.remove(path) end)

  it("lets the endpoint see proc.cancelled() and frees its proc for the next call", function()
    local m = mesh(1)
    local w = m:spawn("waiter", path, {})
    local mark = os.tmpname()
    os.remove(mark)
    finally(function() os.remove(mark) end)
    local f = w:call_one("wait_for_cancel", 20, mark)
    wait_for(function() return io.open(mark) ~= nil end, 10, "the endpoint to start")
    local t0 = monarch.now()
    f:cancel()
    assert.are.equal("cancelled", (kind_of(f)))
    local polls = answer(w:call_one("polls_done"), 2, "the next endpoint call")
    quick(since(t0), 1, "the actor answered its next call")
    assert.is_true(polls > 0, "the endpoint never ran")
  end)
end)

describe("a kernel that ignores the cancel", function()
  setup(function() monarch.hosts() end)

  it("(hang, cut by a 0.2 s timeout) gets its proc killed after cancel_grace, reported unresponsive, and restart brings it back", function()
    local m, events = mesh(1)
    local pid = m:procs()[1].pid
    local t0 = monarch.now()
    local f = m:options{ timeout = 0.2, cancel_grace = 0.5, restart = true }:call_one("hang")
    assert.are.equal("timeout", (kind_of(f)))
    wait_for(function() return #events > 0 end, 5, "a failure event after the timeout")
    local after = since(t0)
    assert.is_true(after >= 0.6, "killed " .. after .. " s after the call: before timeout + cancel_grace (0.7 s)")
    local e = events[1]
    assert.are.equal("unresponsive", e.kind)
    assert.is_truthy(said(e):find("hung", 1, true), "the event does not say the proc hung: " .. said(e))
    assert.are.equal(pid, e.pid)
    assert.are.equal(0, e.rank)
    assert.are.equal("hang", e.kernel)
    assert.is_true(e.restarting)
    m:ready(10)
    local now_pid = m:procs()[1].pid
    assert.are_not.equal(pid, now_pid)
    assert.is_false(alive(pid), "the hung proc was not killed")
    assert.are.equal(7, m:call_one("echo", 7):get()) -- basic reloaded
    assert.are.equal(0, m:call_one("bumps"):get()) -- faulty reloaded, in a new process
    assert.are.equal(1, #events)
  end)

  it("(spin, cut by fut:cancel()) gets its proc killed after cancel_grace and restart serves calls again", function()
    local m, events = mesh(1)
    local pid = m:procs()[1].pid
    -- Running, spin burns CPU: a mark queued before it would not do, as its answer waits behind the spin.
    local idle = procstat.cpu_ticks(pid)
    local f = m:options{ cancel_grace = 0.5, restart = true }:call_one("spin", 30)
    wait_for(function() return procstat.cpu_ticks(pid) >= idle + 10 end, 10, "the spin to burn 0.1 s of CPU")
    local t0 = monarch.now()
    f:cancel()
    assert.are.equal("cancelled", (kind_of(f)))
    wait_for(function() return #events > 0 end, 5, "a failure event after the cancel")
    assert.is_true(since(t0) >= 0.4, "killed " .. since(t0) .. " s after the cancel: before its 0.5 s grace")
    assert.are.equal("unresponsive", events[1].kind)
    assert.is_truthy(said(events[1]):find("hung", 1, true), "the event does not say the proc hung: " .. said(events[1]))
    assert.are.equal(pid, events[1].pid)
    m:ready(10)
    assert.are_not.equal(pid, m:procs()[1].pid)
    assert.is_false(alive(pid), "the spinning proc was not killed")
    assert.are.same({ 7 }, m:call("echo", 7):get():values())
    quick(since(t0), 8, "the mesh answered again")
  end)

  it("is killed after the default grace when no cancel_grace is given", function()
    local m, events = mesh(1)
    local pid = m:procs()[1].pid
    local f = m:options{ timeout = 0.2, restart = true }:call_one("hang")
    assert.are.equal("timeout", (kind_of(f)))
    local t0 = monarch.now()
    -- the default grace is a few seconds
    wait_for(function() return #events > 0 end, 8, "the hung proc to be killed after the cancel")
    assert.is_true(since(t0) >= 0.5, "killed at once, with no grace")
    assert.are.equal("unresponsive", events[1].kind)
    m:ready(10)
    assert.are_not.equal(pid, m:procs()[1].pid)
    assert.are.equal(7, m:call_one("echo", 7):get())
  end)

  it("does not have its cancelled calls retried onto the restarted proc", function()
    local m, events = mesh(1)
    local pol = m:options{ timeout = 0.2, cancel_grace = 0.5, restart = true, retries = 2, backoff = 0.05 }
    local h = pol:call_one("hang")
    local b = pol:call_one("bump") -- queued behind the hang, cancelled there
    b:cancel()
    assert.are.equal("cancelled", (kind_of(b)))
    assert.are.equal("timeout", (kind_of(h)))
    wait_for(function() return #events > 0 end, 5, "a failure event")
    m:ready(10)
    -- A retried hang would hold the new proc (get times out); a retried bump would count.
    assert.are.equal(0, m:call_one("bumps"):get(3))
    monarch.sleep(0.3) -- what is tested: a while (six backoffs) in which a wrong retry would have come
    assert.are.equal(0, m:call_one("bumps"):get(3))
    assert.are.equal(1, m:call_one("bump"):get(3)[1]) -- the new proc counts what does run
    assert.are.equal(1, #events, "the proc was killed again")
  end)

  it("is not confused with a proc busy with an earlier call that was not cancelled", function()
    local m, events = mesh(1)
    local pid = m:procs()[1].pid
    local t0 = monarch.now()
    local first = m:call_one("sleep", 1.5)
    local second = m:options{ timeout = 0.1, cancel_grace = 0.3 }:call_one("bump")
    assert.are.equal("timeout", (kind_of(second)))
    assert.is_nil(first:get()) -- not "sleep: cancelled": it was not the call cancelled
    assert.is_true(since(t0) >= 1.45, "the first sleep ended after " .. since(t0) .. " s")
    monarch.sleep(math.max(0, 2 - since(t0))) -- what is tested: no kill past timeout + grace of the bump
    assert.are.equal(0, #events, #events > 0 and tostring(events[1].message) or "")
    assert.are.equal(pid, m:procs()[1].pid)
    assert.are.equal("ready", m:procs()[1].state)
    assert.is_true(alive(pid))
    assert.are.equal(0, m:call_one("bumps"):get()) -- the timed-out bump never ran
  end)
end)

describe("cancelling a collective", function()
  setup(function() monarch.hosts() end)

  -- Proc i (1-based) holds i everywhere; a sum over n procs is n(n+1)/2.
  local function fill_ranks(m, t)
    for i = 1, m:size() do m:slice{ procs = i - 1 }:call("fill", t, i):get() end
  end

  local function all_equal(t, want)
    for i, h in t:fetch():get():items() do
      assert.are.equal(want, h[1], "proc " .. tostring(i.procs))
      assert.are.equal(want, h[h.numel], "proc " .. tostring(i.procs))
    end
  end

  it("frees a member whose all_reduce waits for a peer that never joins; the procs all_reduce afterwards", function()
    local m = mesh(2)
    local gid = collective.setup_groups(m)[1]
    local t = m:tensor("f32", { 100 })
    local mark, reached = marker()
    m:slice{ procs = 0 }:call_one("mark", mark)
    local f = m:slice{ procs = 0 }:call_one("__coll_all_reduce", gid, t, "sum")
    reached(1)
    assert.is_false(f:done(), "the lone all_reduce ended on its own")
    local t0 = monarch.now()
    f:cancel()
    assert.are.equal("cancelled", (kind_of(f)))
    assert.are.equal(7, answer(m:slice{ procs = 0 }:call_one("echo", 7), 2, "the cancelled member"))
    quick(since(t0), 1, "the cancelled member answered the next call")
    fill_ranks(m, t)
    m:all_reduce(t, "sum"):get(5)
    all_equal(t, 3)
    quick(since(t0), 5, "the mesh all_reduced again") -- the collective timeout is 60 s
  end)

  it("lets an all_reduce complete when the sleep one member had before it is cancelled", function()
    local m = mesh(2)
    local t = m:tensor("f64", { 1000 })
    m:all_reduce(t, "sum"):get() -- the group is up
    fill_ranks(m, t)
    local mark, reached = marker()
    m:call("mark", mark) -- proc 0 reaches the all_reduce, proc 1 the sleep before it
    local s = m:slice{ procs = 1 }:call_one("sleep", 30)
    local ar = m:all_reduce(t, "sum")
    reached(2)
    assert.is_false(ar:done())
    local t0 = monarch.now()
    s:cancel()
    assert.are.equal("cancelled", (kind_of(s)))
    assert.is_nil(ar:get(5))
    quick(since(t0), 2, "the all_reduce completed")
    all_equal(t, 3)
  end)

  it("fails fast a member that joins late an all_reduce whose other member's part was cancelled", function()
    local m = mesh(2)
    local gid = collective.setup_groups(m)[1]
    local t = m:tensor("f32", { 100 })
    local mark, reached = marker()
    m:call("mark", mark) -- proc 0 reaches its all_reduce, proc 1 the sleep before its own
    local s = m:slice{ procs = 1 }:call_one("sleep", 30)
    local late = m:slice{ procs = 1 }:call_one("__coll_all_reduce", gid, t, "sum")
    local f = m:slice{ procs = 0 }:call_one("__coll_all_reduce", gid, t, "sum")
    reached(2)
    local t0 = monarch.now()
    f:cancel()
    assert.are.equal("cancelled", (kind_of(f)))
    s:cancel()
    local ok, err = pcall(late.get, late, 5)
    quick(since(t0), 5, "the late member ended")
    if not ok then
      assert.are_not.equal("timeout", err.kind, "the late member waited for its peer: " .. tostring(err))
    end
    fill_ranks(m, t)
    m:all_reduce(t, "sum"):get(5)
    all_equal(t, 3)
  end)

  it("cancels an all_reduce on every member when its timeout fires: no member waits out the collective timeout", function()
    local m = mesh(3)
    local t = m:tensor("f32", { 1000 })
    m:all_reduce(t, "sum"):get() -- the group is up
    local busy = m:slice{ procs = 2 }:call_one("sleep", 30) -- not cancelled: proc 2 is merely busy
    local t0 = monarch.now()
    local err = fails(function() return m:options{ timeout = 0.5 }:all_reduce(t, "sum"):get() end)
    assert.are.equal("timeout", err.kind)
    local fired = monarch.now()
    quick(fired - t0, 2, "the 0.5 s timeout fired")
    -- Procs 0 and 1 were inside the all_reduce, waiting for proc 2: the cancel got them out.
    assert.are.same({ 7, 7 }, answer(m:slice{ procs = { 0, 2 } }:call("echo", 7), 2, "procs 0 and 1"):values())
    quick(since(fired), 1, "the members that were inside the all_reduce answered")
    busy:cancel()
    -- Proc 2's queued part of the cancelled all_reduce must not hold it or the new group up.
    fill_ranks(m, t)
    m:all_reduce(t, "sum"):get(5)
    all_equal(t, 6)
    quick(since(t0), 8, "the mesh all_reduced again")
  end)
end)
