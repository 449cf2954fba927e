-- Bad input and failures give clear errors that name the proc and kernel,
-- and no process dies because of someone else's mistake.
local monarch = require "monarch"

local function fails(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  return err
end

describe("errors from procs", function()
  local procs

  setup(function()
    procs = monarch.hosts():spawn_procs{ procs = 2 }
    procs:load "basic"
    procs:load "faulty"
  end)

  it("name an unknown kernel, the proc and the host", function()
    local err = fails(function() return procs:call("no_such_kernel"):get() end)
    assert.are.equal("unknown_kernel", err.kind)
    assert.are.equal("no_such_kernel", err.kernel)
    assert.are.equal(0, err.rank)
    assert.is_string(err.host)
    assert.matches("no kernel named 'no_such_kernel'", tostring(err))
    assert.matches("and 1 more failure", tostring(err))
  end)

  it("name an unknown library", function()
    local err = fails(function() procs:load "no_such_library" end)
    assert.are.equal("load", err.kind)
    assert.matches("kernel library 'no_such_library' not found", err.message)
  end)

  it("name the argument of the wrong type", function()
    local t = procs:tensor("f32", { 4 })
    local err = fails(function() return procs:call("axpy", 1.0, t, "oops"):get() end)
    assert.are.equal("bad_args", err.kind)
    assert.matches("argument 3: expected tensor, got string", err.message)
  end)

  it("name a wrong argument count", function()
    local err = fails(function() return procs:call("fill"):get() end)
    assert.matches("expected 2 arguments, got 0", err.message)
  end)

  it("refuse a table as a kernel argument", function()
    local err = fails(function() return procs:call("echo", { 1, 2 }):get() end)
    assert.matches("argument 1: a table cannot be passed to a kernel", err.message)
  end)

  it("refuse a function as an argument before sending", function()
    local err = fails(function() return procs:call("echo", print) end)
    assert.matches("argument 1: a function cannot be sent to a proc", tostring(err))
  end)

  it("carry a kernel's own error message", function()
    local err = fails(function() return procs:slice{ procs = 1 }:call_one("fail", "disk on fire"):get() end)
    assert.are.equal("kernel", err.kind)
    assert.are.equal("fail", err.kernel)
    assert.are.equal(1, err.rank)
    assert.are.equal("disk on fire", err.message)
  end)

  it("leave the proc serving after a kernel error", function()
    assert.are.same({ 1, 2 }, procs:slice{ procs = 1 }:call_one("rank"):get())
  end)
end)

describe("a proc that dies", function()
  it("fails the running call with the signal and the kernel, and later calls too", function()
    local procs = monarch.hosts():spawn_procs{ procs = 2 }
    procs:load "basic"
    procs:load "faulty"
    local victim = procs:slice{ procs = 0 }
    local running = victim:call_one("segv")
    local queued = victim:call_one("noop")
    local err = fails(function() return running:get() end)
    assert.are.equal("proc_failed", err.kind)
    assert.are.equal("segv", err.kernel)
    assert.matches("SIGSEGV", err.message)
    local err2 = fails(function() return queued:get() end)
    assert.matches("before running this call", err2.message)
    local err3 = fails(function() return victim:call_one("noop"):get() end)
    assert.matches("proc is dead", err3.message)
    -- The other proc is untouched.
    assert.are.same({ 1, 2 }, procs:slice{ procs = 1 }:call_one("rank"):get())
    procs:stop()
  end)

  it("reports an abort and an exit code", function()
    local procs = monarch.hosts():spawn_procs{ procs = 2 }
    procs:load "faulty"
    local e1 = fails(function() return procs:slice{ procs = 0 }:call_one("abort"):get() end)
    assert.matches("SIGABRT", e1.message)
    local e2 = fails(function() return procs:slice{ procs = 1 }:call_one("exit", 7):get() end)
    assert.matches("exited with code 7", e2.message)
    assert.are.equal("exit", e2.kernel)
  end)

  it("calls on_failure handlers", function()
    local procs = monarch.hosts():spawn_procs{ procs = 1 }
    procs:load "faulty"
    local seen
    procs:on_failure(function(e) seen = e end)
    pcall(function() return procs:call_one("abort"):get() end)
    assert.is_table(seen)
    assert.are.equal(0, seen.rank)
    assert.matches("SIGABRT", seen.cause)
  end)
end)
