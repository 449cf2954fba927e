-- Futures, and the tasks (monarch.spawn) that await them, with no cluster:
-- the runtime's loop runs over a controller with no connections.
local monarch = require "monarch"
local future = require "monarch.future"
local errors = require "monarch.errors"
local runtime = require "monarch.runtime"

local function error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return err
end

local function kernel_error(msg)
  return errors.new { kind = "kernel", kernel = "k", rank = 0, message = msg or "bad" }
end

setup(function()
  -- core.poll needs core.init; a controller with no connections is enough.
  runtime.init(require("monarch.core").generate_token())
end)

describe("future", function()
  it("starts pending", function()
    local f = future.new("call 'x'")
    assert.is_true(future.is(f))
    assert.is_false(f:done())
    assert.same({ nil, "pending" }, { f:result() })
  end)

  it("resolve makes it done with the value", function()
    local f = future.new()
    f:resolve(42)
    assert.is_true(f:done())
    assert.same({ true, 42 }, { f:result() })
  end)

  it("fail makes it done with the error", function()
    local f, e = future.new(), kernel_error()
    f:fail(e)
    assert.is_true(f:done())
    local ok, got = f:result()
    assert.is_false(ok)
    assert.equal(e, got)
  end)

  it("keeps its first outcome: later resolve and fail are ignored", function()
    local f = future.new()
    f:resolve(1)
    f:resolve(2)
    f:fail(kernel_error())
    assert.same({ true, 1 }, { f:result() })
    local g, e = future.new(), kernel_error("first")
    g:fail(e)
    g:resolve(3)
    g:fail(kernel_error("second"))
    assert.equal(e, select(2, g:result()))
  end)

  it("can resolve with nil and still be done", function()
    local f = future.new()
    f:resolve(nil)
    assert.is_true(f:done())
    assert.same({ true, nil }, { f:result() })
  end)
end)

describe("future:on_done", function()
  it("runs callbacks once, in the order they were added, when the future resolves", function()
    local f, log = future.new(), {}
    f:on_done(function(d) log[#log + 1] = "a:" .. tostring(d.value) end)
    f:on_done(function(d) log[#log + 1] = "b:" .. tostring(d.value) end)
    assert.same({}, log)
    f:resolve(7)
    assert.same({ "a:7", "b:7" }, log)
    f:resolve(8)
    f:fail(kernel_error())
    assert.same({ "a:7", "b:7" }, log)
  end)

  it("passes the future itself, also on failure", function()
    local f, seen = future.new(), nil
    f:on_done(function(d) seen = d end)
    f:fail(kernel_error())
    assert.equal(f, seen)
  end)

  it("runs at once on a future that is already done", function()
    local f, ran = future.new(), false
    f:resolve("v")
    f:on_done(function() ran = true end)
    assert.is_true(ran)
  end)
end)

describe("future:get", function()
  it("returns the value of a resolved future", function()
    local f = future.new()
    f:resolve({ 1, 2 })
    assert.same({ 1, 2 }, f:get())
  end)

  it("raises the very error object of a failed future", function()
    local f, e = future.new(), kernel_error("boom")
    f:fail(e)
    assert.equal(e, error_of(f.get, f))
    assert.equal(e, error_of(f.get, f)) -- every time
  end)

  it("runs the loop until a task resolves the future", function()
    local f = future.new()
    monarch.spawn(function() f:resolve("from task") end)
    assert.equal("from task", f:get())
    runtime.drain_tasks()
  end)

  it("raises a timeout MonarchError after its timeout and leaves the future pending", function()
    local f = future.new("call 'slow'")
    local t0 = monarch.now()
    local e = error_of(f.get, f, 0.02)
    assert.is_true(errors.is(e))
    assert.equal("timeout", e.kind)
    assert.matches("call 'slow' not done after 0.02s", e.message, 1, true)
    assert.is_true(monarch.now() - t0 >= 0.02)
    assert.is_false(f:done())
  end)
end)

describe("future:await outside a task", function()
  it("returns the value like get", function()
    local f = future.new()
    f:resolve("v")
    assert.equal("v", f:await())
  end)

  it("raises the same error object like get", function()
    local f, e = future.new(), kernel_error()
    f:fail(e)
    assert.equal(e, error_of(f.await, f))
  end)

  it("runs the loop until the future is done, like get", function()
    local f = future.new()
    monarch.spawn(function() f:resolve(5) end)
    assert.equal(5, f:await())
    runtime.drain_tasks()
  end)
end)

describe("tostring(future)", function()
  it("shows what it is and that it is pending", function()
    assert.equal("Future(call 'axpy'): pending", tostring(future.new("call 'axpy'")))
    assert.equal("Future(?): pending", tostring(future.new()))
  end)

  it("shows a resolved value", function()
    local f = future.new("x")
    f:resolve(3)
    assert.equal("Future(x): ok 3", tostring(f))
  end)

  it("shows a table value as <table>, an object as <value>", function()
    local f, g = future.new("x"), future.new("y")
    f:resolve({})
    g:resolve(setmetatable({}, {}))
    assert.equal("Future(x): ok <table>", tostring(f))
    assert.equal("Future(y): ok <value>", tostring(g))
  end)

  it("shows the error of a failed future", function()
    local f = future.new("x")
    f:fail(errors.new { kind = "kernel", kernel = "k", message = "bad" })
    assert.equal("Future(x): error monarch: kernel in 'k': bad", tostring(f))
  end)
end)

describe("monarch.spawn", function()
  it("returns a future resolved with the task's return value once the tasks drain", function()
    local f = monarch.spawn(function(a, b) return a + b end, 2, 3)
    assert.is_true(future.is(f))
    runtime.drain_tasks()
    assert.same({ true, 5 }, { f:result() })
    assert.equal(0, runtime.stats().tasks)
  end)

  it("passes every argument, nils included", function()
    local f = monarch.spawn(function(...) return { n = select("#", ...), ... } end, 1, nil, 3)
    runtime.drain_tasks()
    assert.same({ n = 3, 1, nil, 3 }, f:get())
  end)

  it("does not run the task until the loop runs", function()
    local ran = false
    local f = monarch.spawn(function() ran = true end)
    assert.is_false(ran)
    assert.is_false(f:done())
    runtime.drain_tasks()
    assert.is_true(ran)
  end)

  it("rejects something that is not a function", function()
    assert.matches("monarch.spawn wants a function, got number", error_of(monarch.spawn, 5), 1, true)
  end)

  it("interleaves two tasks that await futures the other resolves", function()
    local log = {}
    local a_go, b_go = future.new("a_go"), future.new("b_go")
    local ta = monarch.spawn(function()
      log[#log + 1] = "a1"
      local v = a_go:await()
      log[#log + 1] = "a2:" .. v
      b_go:resolve("from a")
      return "a done"
    end)
    local tb = monarch.spawn(function()
      log[#log + 1] = "b1"
      a_go:resolve("from b")
      log[#log + 1] = "b2"
      local v = b_go:await()
      log[#log + 1] = "b3:" .. v
      return "b done"
    end)
    runtime.drain_tasks()
    assert.same({ "a1", "b1", "b2", "a2:from b", "b3:from a" }, log)
    assert.equal("a done", ta:get())
    assert.equal("b done", tb:get())
  end)

  it("lets a task await another task's future", function()
    local inner
    local outer = monarch.spawn(function()
      inner = monarch.spawn(function() return 10 end)
      return inner:await() * 2
    end)
    runtime.drain_tasks()
    assert.equal(20, outer:get())
  end)

  it("lets get inside a task yield like await", function()
    local gate = future.new()
    local log = {}
    local t = monarch.spawn(function()
      local v = gate:get()
      log[#log + 1] = "got " .. v
      return v
    end)
    monarch.spawn(function()
      log[#log + 1] = "opening"
      gate:resolve("open")
    end)
    runtime.drain_tasks()
    assert.same({ "opening", "got open" }, log)
    assert.equal("open", t:get())
  end)

  it("raises a failure the task's future got inside the awaiting task", function()
    local e = kernel_error("remote")
    local f = future.new()
    local t = monarch.spawn(function()
      local ok, got = pcall(f.await, f)
      return { ok, got }
    end)
    monarch.spawn(function() f:fail(e) end)
    runtime.drain_tasks()
    local r = t:get()
    assert.is_false(r[1])
    assert.equal(e, r[2])
  end)

  it("fails the task's future with a traceback string when the task errors", function()
    local f = monarch.spawn(function() error("task went wrong") end)
    local drained_ok, drained_err = pcall(runtime.drain_tasks)
    -- nobody observed the failure, so draining raises it
    assert.is_false(drained_ok)
    local ok, err = f:result()
    assert.is_false(ok)
    assert.is_string(err)
    assert.matches("task went wrong", err, 1, true)
    assert.matches("stack traceback:", err, 1, true)
    assert.matches("future_spec.lua", err, 1, true)
    assert.equal(err, drained_err)
    -- drain raised it once; it is not raised again
    runtime.drain_tasks()
  end)

  it("passes a MonarchError raised in a task through unchanged", function()
    local e = kernel_error("typed")
    local f = monarch.spawn(function() error(e) end)
    assert.equal(e, error_of(runtime.drain_tasks))
    assert.equal(e, select(2, f:result()))
  end)

  it("does not raise from drain a failure that get already observed", function()
    local f = monarch.spawn(function() error("seen") end)
    assert.matches("seen", error_of(f.get, f), 1, true)
    runtime.drain_tasks() -- must not raise
  end)
end)

describe("monarch.all", function()
  it("resolves with the values in the order of the futures, not of completion", function()
    local a, b, c = future.new(), future.new(), future.new()
    local all = monarch.all { a, b, c }
    c:resolve("c")
    a:resolve("a")
    assert.is_false(all:done())
    b:resolve("b")
    assert.same({ "a", "b", "c" }, all:get())
  end)

  it("resolves an empty list at once with an empty list", function()
    local all = monarch.all {}
    assert.is_true(all:done())
    assert.same({}, all:get())
  end)

  it("accepts futures that are already done", function()
    local a = future.new()
    a:resolve(1)
    local b = future.new()
    local all = monarch.all { a, b }
    b:resolve(2)
    assert.same({ 1, 2 }, all:get())
  end)

  it("fails fast with the first error, before the others are done", function()
    local a, b, c = future.new(), future.new(), future.new()
    local e1, e2 = kernel_error("first"), kernel_error("second")
    local all = monarch.all { a, b, c }
    b:fail(e1)
    assert.is_true(all:done())
    assert.equal(e1, error_of(all.get, all))
    c:fail(e2)
    a:resolve(1)
    assert.equal(e1, select(2, all:result()))
  end)

  it("marks a failed task it waits on as observed, so drain does not raise it", function()
    local t1 = monarch.spawn(function() return 1 end)
    local t2 = monarch.spawn(function() error("t2 failed") end)
    local all = monarch.all { t1, t2 }
    runtime.drain_tasks() -- must not raise: all observed t2
    assert.matches("t2 failed", error_of(all.get, all), 1, true)
  end)

  it("collects the results of tasks", function()
    local ts = {}
    for i = 1, 5 do ts[i] = monarch.spawn(function() return i * i end) end
    local all = monarch.all(ts)
    runtime.drain_tasks()
    assert.same({ 1, 4, 9, 16, 25 }, all:get())
  end)
end)

describe("monarch.sleep", function()
  it("suspends only the task that sleeps, for at least the time asked", function()
    local log = {}
    local t0 = monarch.now()
    local sleeper = monarch.spawn(function()
      log[#log + 1] = "sleeping"
      local r = monarch.sleep(0.03)
      log[#log + 1] = "woke"
      return { r, monarch.now() - t0 }
    end)
    monarch.spawn(function() log[#log + 1] = "other ran" end)
    runtime.drain_tasks()
    assert.same({ "sleeping", "other ran", "woke" }, log)
    local r = sleeper:get()
    assert.is_true(r[1])
    assert.is_true(r[2] >= 0.03, "woke after " .. r[2] .. "s")
  end)

  -- The pump's wait respects sleep deadlines (it used to poll every 250 ms). What the loop is asked to
  -- wait is checked, not how long it took: a loaded machine may be slow to wake, never wrong to ask.
  it("asks the loop to wait no longer than its deadline rather than the 250 ms between ticks", function()
    local core = require "monarch.core"
    local poll, waits = core.poll, {}
    core.poll = function(ev, ms) waits[#waits + 1] = ms return poll(ev, ms) end
    local ok, err = pcall(monarch.sleep, 0.01)
    core.poll = poll
    assert(ok, err)
    assert.is_true(#waits > 0, "the sleep never waited in the loop")
    for _, ms in ipairs(waits) do assert.is_true(ms <= 10, "the loop was asked to wait " .. ms .. " ms") end
  end)
end)
