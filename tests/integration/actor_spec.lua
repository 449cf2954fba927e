-- Lua actors on real procs: state, verbs, errors with the worker's traceback,
-- code sync by content hash, kernels and tensors used locally.
local monarch = require "monarch"
local actor = require "monarch.actor"

local dir -- actor modules written for these specs, so tracebacks name real files

local function write(name, source)
  local path = dir .. "/" .. name
  local f = assert(io.open(path, "wb"))
  f:write(source)
  f:close()
  return path
end

local function fails(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "expected an error")
  return err
end

local COUNTER = [[
local Counter = {}
Counter.__index = Counter

function Counter.new(args, ctx)
  return setmetatable({ n = args.start or 0, rank = ctx.rank, world = ctx.world }, Counter)
end

function Counter:add(k)
  self.n = self.n + (k or 1)
  return self.n
end

function Counter:where() return { rank = self.rank, world = self.world, proc_rank = proc.rank } end

function Counter:nested() return { a = { 1, 2, { x = "y" } }, b = true, c = 2.5 }, "second" end

function Counter:fail(msg)
  local function inner() error(msg or "counter failed") end
  inner()
end

function Counter:bad_result() return print end

function Counter:_private() return "hidden" end

return Counter
]]

-- An actor that calls the meshes it is handed.
local CALLER = [[
local C = {}
C.__index = C
function C.new(args) return setmetatable({ peer = args.peer, n = 0 }, C) end
function C:rank_sum(procs)
  local ranks, world = 0, 0
  for _, r in ipairs(procs:call("rank")) do ranks, world = ranks + r[1], r[2] end
  return { ranks, world }
end
function C:fill_and_sum(procs, t, v)
  procs:call("fill", t, v)
  local total = 0
  for _, s in ipairs(procs:call("sum", t)) do total = total + s end
  return total
end
function C:bump_peer(k)
  local v = self.peer:call("add", k)
  return v[1] + v[2]
end
function C:bump_one(peer, spec) return peer:slice(spec):call_one("add", 1) end
function C:safe_missing(procs)
  local ok, e = pcall(function() return procs:slice({ procs = 1 }):call_one("no_such_kernel") end)
  return { ok = ok, kind = e.kind, message = e.message, rank = e.rank }
end
function C:safe_call_one(procs)
  local ok, e = pcall(procs.call_one, procs, "rank")
  return { ok = ok, message = e.message }
end
function C:unsafe_missing(procs)
  local r = procs:call("no_such_kernel")
  return r
end
function C:yield_itself() coroutine.yield(1) end
-- Sleeps on every proc, then adds 1 to the local count: returns the count
-- before and after, so two of these can be told apart.
function C:slow_bump(procs, s)
  local before = self.n
  procs:call("sleep", s)
  self.n = self.n + 1
  return { before, self.n }
end
function C:ask_self(me)
  if self.asked then return 1 end
  self.asked = true
  return me:call_one("ask_self", me)
end
return C
]]

local KERNEL_USER = [[
local K = {}
K.__index = K
function K.new(args, ctx)
  local t = proc.new_tensor("f64", { args.n })
  proc.call("fill", t, args.value)
  return setmetatable({ t = t }, K)
end
function K:sum() return proc.call("sum", self.t) end
-- Writes the controller's tensor through its memory, then sums it with a kernel.
function K:scale_into(view, k)
  for i = 0, view.numel - 1 do view.data[i] = (i + 1) * k end
  return proc.call("sum", view), view.dtype, view.shape
end
function K:missing_kernel() return proc.call("no_such_kernel") end
function K:bad_kernel_args() return proc.call("fill", self.t, "not a number") end
return K
]]

describe("actors on a mesh", function()
  local procs

  setup(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir) == 0 or true)
    write("counter.lua", COUNTER)
    write("kernel_user.lua", KERNEL_USER)
    write("caller.lua", CALLER)
    procs = monarch.hosts():spawn_procs { procs = 2 }
    procs:load "basic"
  end)

  teardown(function()
    procs:stop()
    os.execute("rm -rf " .. dir)
  end)

  it("keep their state between calls, one instance per proc", function()
    local c = procs:spawn("state", dir .. "/counter.lua", { start = 10 })
    assert.are.same({ 11, 11 }, c:call("add"):get():values())
    assert.are.same({ 16, 16 }, c:call("add", 5):get():values())
    assert.are.equal(17, c:slice { procs = 1 }:call_one("add"):get())
    assert.are.same({ 17, 18 }, c:call("add"):get():values())
    assert.are.same({ rank = 1, world = 2, proc_rank = 1 }, c:slice { procs = 1 }:call_one("where"):get())
    c:stop():get()
  end)

  it("answer with the verbs of kernels: call, call_one, choose, broadcast, stream", function()
    local c = procs:spawn("verbs", dir .. "/counter.lua", {})
    c:broadcast("add", 2)
    assert.are.same({ 2, 2 }, c:call("add", 0):get():values())
    local v = c:choose("add", 1):get()
    assert.are.equal(3, v)
    local seen = {}
    for coords, n in c:stream("add", 0) do seen[coords.procs] = n end
    assert.are.equal(5, seen[0] + seen[1]) -- one of them got the chosen call
    assert.are.equal(2, c:size())
    assert.has_error(function() c:call_one("add") end,
      "call_one needs a mesh of exactly one actor; this one has 2 (slice it first)")
    c:stop():get()
  end)

  it("return several values and nested tables", function()
    local c = procs:spawn("nested", dir .. "/counter.lua", {})
    local v = c:slice { procs = 0 }:call_one("nested"):get()
    assert.are.same({ { a = { 1, 2, { x = "y" } }, b = true, c = 2.5 }, "second" }, v)
    c:stop():get()
  end)

  it("report an endpoint error with the worker's traceback, file and line, host and rank", function()
    local c = procs:spawn("err", dir .. "/counter.lua", {})
    local err = fails(function() return c:slice { procs = 1 }:call_one("fail", "out of fuel"):get() end)
    assert.are.equal("actor", err.kind)
    assert.are.equal("err.fail", err.kernel)
    assert.are.equal(1, err.rank)
    assert.is_string(err.host)
    assert.matches("counter.lua:18: out of fuel", err.message, 1, true)
    assert.matches("counter.lua:19: in function", err.traceback, 1, true)
    assert.matches("on rank 1", tostring(err), 1, true)
    -- The proc is fine, and so is the actor's state.
    assert.are.equal(1, c:slice { procs = 1 }:call_one("add"):get())
    assert.are.same({ 1, 2 }, procs:slice { procs = 1 }:call_one("rank"):get())
    c:stop():get()
  end)

  it("name an unknown endpoint and list the endpoints there are", function()
    local c = procs:spawn("names", dir .. "/counter.lua", {})
    local err = fails(function() return c:call("nope"):get() end)
    assert.matches("actor 'names' has no endpoint 'nope' %(endpoints: add, bad_result, fail, nested, where%)", err.message)
    assert.has_error(function() c:call("_private") end,
      "'_private' is not an endpoint (new and names starting with _ are not callable)")
    c:stop():get()
  end)

  it("name a result that cannot be sent", function()
    local c = procs:spawn("res", dir .. "/counter.lua", {})
    local err = fails(function() return c:call("bad_result"):get() end)
    assert.are.equal("actor", err.kind)
    assert.matches("result 1: a function cannot be sent to the controller", err.message, 1, true)
    c:stop():get()
  end)

  it("send a module's source to a proc once, then only its hash", function()
    local p0 = procs:slice { procs = 0 }
    local before = p0:call_one("__actor_stats"):get()
    local sent = actor.stats().sources_sent
    local path = write("synced.lua", "return { new = function() return {} end, hi = function() return 'hi' end }\n")
    local a = procs:spawn("sync_a", path, {})
    local b = procs:spawn("sync_b", path, {})
    local after = p0:call_one("__actor_stats"):get()
    assert.are.equal(before.defines + 1, after.defines)
    assert.are.equal(before.spawns + 2, after.spawns)
    assert.are.equal(sent + 2, actor.stats().sources_sent) -- once per proc, not per spawn
    assert.is_true(p0:call_one("__actor_has", actor.resolve(path).hash):get())
    assert.are.same({ "hi", "hi" }, b:call("hi"):get():values())
    a:stop():get()
    b:stop():get()
  end)

  it("send a changed module again under its new hash", function()
    local path = write("changing.lua", "return { new = function() return {} end, v = function() return 1 end }\n")
    local a = procs:spawn("v1", path, {})
    write("changing.lua", "return { new = function() return {} end, v = function() return 2 end }\n")
    local b = procs:spawn("v2", path, {})
    assert.are.same({ 1, 1 }, a:call("v"):get():values())
    assert.are.same({ 2, 2 }, b:call("v"):get():values())
    a:stop():get()
    b:stop():get()
  end)

  it("call the proc's kernels and read and write its tensors in place", function()
    local k = procs:spawn("kern", dir .. "/kernel_user.lua", { n = 4, value = 2.5 })
    assert.are.same({ 10, 10 }, k:call("sum"):get():values())
    local t = procs:tensor("f32", { 2, 2 })
    local v = k:slice { procs = 0 }:call_one("scale_into", t, 2):get()
    assert.are.same({ 20, "f32", { 2, 2 } }, v)
    assert.are.same({ 2, 4, 6, 8 }, t:fetch():get()[1]:totable())
    t:free()
    local err = fails(function() return k:call("missing_kernel"):get() end)
    assert.matches("proc.call: no kernel named 'no_such_kernel' is loaded on this proc", err.message, 1, true)
    err = fails(function() return k:call("bad_kernel_args"):get() end)
    assert.matches("proc.call('fill'): argument 2: expected number, got string", err.message, 1, true)
    k:stop():get()
  end)

  it("free the tensors an actor made when it stops", function()
    local p0 = procs:slice { procs = 0 }
    p0:call_one("noop"):get()
    local before = p0:call_one("__info"):get()[5]
    local k = p0:spawn("freed", dir .. "/kernel_user.lua", { n = 8, value = 1 })
    assert.are.equal(before + 1, p0:call_one("__info"):get()[5])
    assert.are.same({ true }, k:stop():get():values())
    assert.are.equal(before, p0:call_one("__info"):get()[5])
    local err = fails(function() return k:call("sum"):get() end)
    assert.matches("actor 'freed' was stopped on this proc", err.message, 1, true)
  end)

  it("ship the modules an actor requires with it", function()
    write("helper_mod.lua", "return { twice = function(x) return 2 * x end }\n")
    local old = package.path
    package.path = dir .. "/?.lua;" .. package.path
    local ok, a = pcall(procs.spawn, procs, "deps",
      { source = "local h = require 'helper_mod'\nreturn { new = function() return {} end, " ..
        "go = function(_, x) return h.twice(x) end }", name = "uses_helper" }, {}, { deps = { "helper_mod" } })
    package.path = old
    assert(ok, tostring(a))
    assert.are.same({ 42, 42 }, a:call("go", 21):get():values())
    a:stop():get()
  end)

  it("refuse a module that cannot be found, with its name", function()
    local err = fails(function() procs:spawn("nf", "no.such.module", {}) end)
    assert.are.equal("actor", err.kind)
    assert.matches("actor module 'no.such.module' not found", err.message, 1, true)
    err = fails(function() procs:spawn("nf", dir .. "/absent.lua", {}) end)
    assert.matches("cannot read actor module", err.message, 1, true)
  end)

  it("refuse a module that does not compile, with file and line", function()
    local path = write("broken.lua", "local M = {}\nfunction M.new( return M\n")
    local err = fails(function() procs:spawn("broken", path, {}) end)
    assert.matches("broken.lua:2:", err.message, 1, true)
  end)

  it("refuse a module without a constructor", function()
    local path = write("no_new.lua", "return { step = function() end }\n")
    local err = fails(function() procs:spawn("no_new", path, {}) end)
    assert.are.equal("actor", err.kind)
    assert.matches("must return a table with a new%(args, ctx%) function", err.message)
  end)

  it("fail spawn with the constructor's traceback, and keep the name free", function()
    local path = write("bad_new.lua", "local M = {}\nfunction M.new(args)\n  error('no envs: ' .. tostring(args.n))\nend\nreturn M\n")
    local err = fails(function() procs:spawn("bad_new", path, { n = 0 }) end)
    assert.are.equal("actor", err.kind)
    assert.matches("bad_new.lua:3: no envs: 0", err.message, 1, true)
    local c = procs:spawn("bad_new", dir .. "/counter.lua", {})
    c:stop():get()
  end)

  it("refuse a second actor with the same name on a proc", function()
    local c = procs:spawn("twice", dir .. "/counter.lua", {})
    local err = fails(function() procs:spawn("twice", dir .. "/counter.lua", {}) end)
    assert.matches("an actor named 'twice' already runs on this proc", err.message, 1, true)
    c:stop():get()
  end)

  it("can be handed a ProcMesh and run kernels on it, tensors included", function()
    local c = procs:spawn("mcaller", dir .. "/caller.lua", {})
    local relayed = actor.stats().relayed
    -- Every proc's "rank" kernel: ranks 0 and 1, world 2, summed by the actor.
    assert.are.same({ 1, 2 }, c:slice { procs = 0 }:call_one("rank_sum", procs):get())
    local t = procs:tensor("f64", { 4 })
    assert.are.equal(2 * 4 * 1.5, c:slice { procs = 1 }:call_one("fill_and_sum", procs, t, 1.5):get())
    assert.are.same({ 6, 6 }, t:fetch():get():map(function(v) return v:totable()[1] * 4 end):values())
    assert.are.same({ { 1, 2 }, { 1, 2 } }, c:call("rank_sum", procs):get():values())
    assert.is_true(actor.stats().relayed >= relayed + 4)
    t:free()
    c:stop():get()
  end)

  it("can be handed an ActorMesh, at spawn or in a call, and call its endpoints", function()
    local counter = procs:spawn("mpeer", dir .. "/counter.lua", { start = 100 })
    local c = procs:spawn("mcaller2", dir .. "/caller.lua", { peer = counter })
    assert.are.equal(101 + 101, c:slice { procs = 0 }:call_one("bump_peer", 1):get())
    assert.are.equal(102, c:slice { procs = 0 }:call_one("bump_one", counter, { procs = 1 }):get())
    assert.are.same({ 101, 102 }, counter:call("add", 0):get():values())
    -- choose and stream follow their endpoint through its mesh calls too.
    assert.are.equal(203, c:choose("bump_peer", 0):get())
    local seen = 0
    for _, v in c:stream("bump_peer", 0) do
      assert.are.equal(203, v)
      seen = seen + 1
    end
    assert.are.equal(2, seen)
    c:stop():get()
    counter:stop():get()
  end)

  it("hand an inner call's error to the endpoint, or fail the call with it", function()
    local c = procs:spawn("mcaller3", dir .. "/caller.lua", {})
    local r = c:slice { procs = 0 }:call_one("safe_missing", procs):get()
    assert.are.equal(false, r.ok)
    assert.are.equal(1, r.rank)
    assert.matches("no_such_kernel", r.message, 1, true)
    -- An error the controller raises making the call comes back the same way.
    r = c:slice { procs = 0 }:call_one("safe_call_one", procs):get()
    assert.are.equal(false, r.ok)
    assert.matches("call_one needs a mesh of exactly one proc", r.message, 1, true)
    local err = fails(function() return c:slice { procs = 1 }:call_one("unsafe_missing", procs):get() end)
    assert.are.equal("actor", err.kind)
    assert.are.equal("mcaller3.unsafe_missing", err.kernel)
    assert.matches("mesh call failed: monarch: ", err.message, 1, true)
    assert.matches("no_such_kernel", err.message, 1, true)
    assert.matches("caller.lua:%d+: in function", err.traceback)
    -- The proc and the actor go on serving; nothing is left waiting.
    assert.are.same({ 1, 2 }, c:slice { procs = 1 }:call_one("rank_sum", procs):get())
    assert.are.equal(0, procs:slice { procs = 1 }:call_one("__actor_stats"):get().waiting)
    err = fails(function() return c:slice { procs = 0 }:call_one("yield_itself"):get() end)
    assert.matches("yielded outside a mesh call", err.message, 1, true)
    c:stop():get()
  end)

  it("serve other calls, to the same actor too, while an endpoint waits on a mesh", function()
    local counter = procs:spawn("mpeer4", dir .. "/counter.lua", {})
    local c = procs:spawn("mcaller4", dir .. "/caller.lua", { peer = counter })
    local one = c:slice { procs = 0 }
    -- Both calls are on proc 0 before either inner call is answered.
    local f1 = one:call_one("slow_bump", procs, 0.2)
    local f2 = one:call_one("slow_bump", procs, 0.1)
    local v1, v2 = f1:get(10), f2:get(10)
    -- Both started from a count of 0: the second began while the first waited.
    assert.are.same({ 0, 0 }, { v1[1], v2[1] })
    assert.are.same({ 1, 2 }, { math.min(v1[2], v2[2]), math.max(v1[2], v2[2]) })
    -- An endpoint that calls its own actor mesh, on its own proc.
    assert.are.equal(1, one:call_one("ask_self", one):get())
    assert.are.equal(0, procs:slice { procs = 0 }:call_one("__actor_stats"):get().waiting)
    c:stop():get()
    counter:stop():get()
  end)

  it("cannot end their proc with os.exit", function()
    local a = procs:spawn("exiter", { source = "return { new = function() return {} end, " ..
      "quit = function() os.exit(3) end }", name = "exiter" })
    local err = fails(function() return a:call("quit"):get() end)
    assert.matches("os.exit is not available to actors", err.message, 1, true)
    assert.are.same({ 0, 2 }, procs:slice { procs = 0 }:call_one("rank"):get())
    a:stop():get()
  end)

  it("report the Lua memory they use", function()
    local s = procs:slice { procs = 0 }:call_one("__actor_stats"):get()
    assert.is_true(s.mem_bytes > 0 and s.mem_bytes <= s.mem_peak and s.mem_peak < s.mem_limit)
  end)
end)

describe("actors on a proc that is restarted", function()
  it("are spawned again on the replacement", function()
    local procs = monarch.hosts():spawn_procs { procs = 1 }:options { restart = true }
    procs:load "basic"
    local c = procs:spawn("phoenix", { source = COUNTER, name = "counter" }, { start = 100 })
    assert.are.equal(101, c:call_one("add"):get())
    local pid = procs:procs()[1].pid
    os.execute("kill -KILL " .. pid)
    local t0 = monarch.now()
    while procs:procs()[1].pid == pid and monarch.now() - t0 < 10 do monarch.sleep(0.05) end
    procs:ready(30)
    assert.are_not.equal(pid, procs:procs()[1].pid)
    assert.are.equal(101, c:call_one("add"):get()) -- a fresh actor, from its spawn args
    procs:stop()
  end)
end)
