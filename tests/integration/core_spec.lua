-- Real host agent and proc processes on this machine, driven in-process.
local monarch = require "monarch"

describe("a mesh of real procs", function()
  local procs

  setup(function()
    procs = monarch.hosts():spawn_procs{ procs = 4 }
    procs:load "basic"
  end)

  it("has the shape it was spawned with", function()
    assert.are.equal(4, procs:size())
    assert.are.same({ hosts = 1, procs = 4 }, procs:sizes())
    assert.are.same({ 0, 1, 2, 3 }, procs:rank())
    assert.are.equal(2, procs:rank{ procs = 2 })
  end)

  it("runs a kernel on every proc and returns a ValueMesh by coordinates", function()
    local vm = procs:call("rank"):get()
    assert.are.equal(4, vm:size())
    for coords, v in vm:items() do
      assert.are.same({ coords.procs, 4 }, v)
    end
    assert.are.same({ 3, 4 }, vm:get{ procs = 3 })
  end)

  it("call_one on a slice of one proc returns that proc's value", function()
    local v = procs:slice{ procs = 1 }:call_one("echo", "x", 7, 2.5, true):get()
    assert.are.same({ "x", 7, 2.5, true }, v)
  end)

  it("call_one refuses a mesh of several procs", function()
    assert.has_error(function() procs:call_one("noop") end,
      "call_one needs a mesh of exactly one proc; this one has 4 (slice it first)")
  end)

  it("slices a range and keeps coordinates relative to the slice", function()
    local s = procs:slice{ procs = { 1, 3 } }
    assert.are.equal(2, s:size())
    local vm = s:call("rank"):get()
    assert.are.same({ 1, 4 }, vm:get{ procs = 0 })
    assert.are.same({ 2, 4 }, vm:get{ procs = 1 })
  end)

  it("runs calls to one proc in the order they were sent", function()
    local p = procs:slice{ procs = 0 }
    local t = p:tensor("f64", { 8 })
    local futs = {}
    for i = 1, 200 do
      futs[#futs + 1] = p:call("fill", t, i)
      futs[#futs + 1] = p:call("sum", t)
    end
    for i = 1, 200 do
      assert.are.equal(8 * i, futs[2 * i]:get()[1])
    end
    t:free()
  end)

  it("keeps tensors on the procs and fetches them on request", function()
    local t = procs:tensor("f32", { 2, 3 })
    procs:call("iota", t, 1):get()
    procs:call("scale", t, 2):get()
    local vm = t:fetch():get()
    for _, h in vm:items() do
      assert.are.same({ 2, 4, 6, 8, 10, 12 }, h:totable())
      assert.are.same({ 2, 3 }, h.shape)
    end
    t:put({ 1, 1, 1, 1, 1, 1 }):get()
    assert.are.same({ 6, 6, 6, 6 }, procs:call("sum", t):get():values())
    t:free()
    local ok, err = pcall(function() return t:fetch() end)
    assert.is_false(ok)
    assert.matches("was freed", tostring(err))
  end)

  it("streams tensors larger than one chunk both ways, landing in place", function()
    local tensor = require "monarch.tensor"
    local n = 3 * tensor.CHUNK / 4 + 123 -- f32: three chunks and a bit
    local t = procs:tensor("f32", { n })
    procs:call("iota", t, 1):get()
    local vm = t:fetch():get()
    for _, h in vm:items() do
      assert.are.equal(1, h[1])
      assert.are.equal(n, h[n])
      assert.are.equal(tensor.CHUNK / 4 + 1, h[tensor.CHUNK / 4 + 1])
    end
    -- put from a host tensor, straight from its memory
    local src = tensor.host("f32", { n })
    for i = 1, n, 997 do src[i] = -i end
    t:put(src):get()
    local back = t:fetch(vm):get() -- into the same host tensors
    assert.are.equal(vm[1], back[1]) -- the same host tensors, refilled
    for _, h in back:items() do
      assert.are.equal(-1, h[1])
      assert.are.equal(-998, h[998])
      assert.are.equal(0, h[2])
    end
    assert.has_error(function() t:put(tensor.host("f32", { 3 })) end)
    assert.has_error(function() t:fetch({ tensor.host("f32", { 3 }) }) end)
    t:free()
  end)

  it("scatters a different value to each proc", function()
    local t = procs:tensor("i32", { 3 })
    t:scatter({ { 1, 1, 1 }, { 2, 2, 2 }, { 3, 3, 3 }, { 4, 4, 4 } }):get()
    assert.are.same({ 3, 6, 9, 12 }, procs:call("sum", t):get():values())
    assert.has_error(function() t:scatter({ { 1, 1, 1 } }) end, "scatter wants one value per proc (4)")
    t:free()
  end)

  it("frees tensors that the garbage collector collects", function()
    local p = procs:slice{ procs = 0 }
    collectgarbage()
    collectgarbage()
    p:call_one("noop"):get() -- frees of tensors earlier specs dropped
    local before = p:call_one("__info"):get()[5]
    for _ = 1, 50 do p:tensor("f32", { 16 }) end
    collectgarbage()
    collectgarbage()
    p:call_one("noop"):get() -- flushes the queued frees
    local after = p:call_one("__info"):get()[5]
    assert.are.equal(before, after)
  end)

  it("computes with OpenBLAS sgemm on the procs", function()
    local a = procs:tensor("f32", { 2, 3 })
    local b = procs:tensor("f32", { 3, 2 })
    local c = procs:tensor("f32", { 2, 2 })
    a:put({ 1, 2, 3, 4, 5, 6 }):get()
    b:put({ 7, 8, 9, 10, 11, 12 }):get()
    procs:call("sgemm", a, b, c):get()
    local h = c:fetch():get()[1]
    assert.are.same({ 58, 64, 139, 154 }, h:totable())
  end)

  it("broadcast sends without waiting and keeps order with later calls", function()
    local t = procs:tensor("f32", { 4 })
    procs:broadcast("fill", t, 3)
    assert.are.same({ 12, 12, 12, 12 }, procs:call("sum", t):get():values())
  end)

  it("choose runs on one live proc", function()
    local v = procs:choose("rank"):get()
    assert.is_true(v[1] >= 0 and v[1] < 4)
  end)

  it("stream yields every proc's result as it arrives", function()
    local seen = {}
    for coords, v in procs:stream("rank") do seen[coords.procs] = v[1] end
    assert.are.same({ [0] = 0, 1, 2, 3 }, seen)
  end)

  it("times a call out with the timeout option", function()
    local p = procs:slice{ procs = 3 }:options{ timeout = 0.2 }
    local t0 = monarch.now()
    local ok, err = pcall(function() return p:call_one("sleep", 1.0):get() end)
    assert.is_false(ok)
    assert.are.equal("timeout", err.kind)
    assert.are.equal(3, err.rank)
    assert.is_true(monarch.now() - t0 < 0.9)
    procs:slice{ procs = 3 }:call_one("noop"):get() -- the proc is fine afterwards
  end)

  it("answers pings while a long kernel runs", function()
    local f = procs:call("sleep", 0.5)
    local rtts = procs:ping():get()
    for _, r in rtts:items() do assert.is_true(r < 0.25) end
    f:get()
  end)

  it("awaits futures inside tasks without blocking each other", function()
    local order = {}
    local a = monarch.spawn(function()
      procs:slice{ procs = 0 }:call_one("sleep", 0.2):await()
      order[#order + 1] = "slow"
    end)
    local b = monarch.spawn(function()
      procs:slice{ procs = 1 }:call_one("noop"):await()
      order[#order + 1] = "fast"
    end)
    monarch.all({ a, b }):get()
    assert.are.same({ "fast", "slow" }, order)
  end)

  it("runs a second mesh beside the first", function()
    local other = monarch.hosts():spawn_procs{ { "dp", 2 }, { "tp", 2 } }
    assert.are.same({ hosts = 1, dp = 2, tp = 2 }, other:sizes())
    other:load "basic"
    local vm = other:slice{ dp = 1 }:call("rank"):get()
    assert.are.same({ 2, 4 }, vm:get{ tp = 0 }) -- ranks count within each spawn
    other:stop()
  end)
end)

describe("a host agent spawning procs", function()
  local mesh_mod = require "monarch.mesh"
  local runtime = require "monarch.runtime"

  -- An agent of our own, with env before its command line; returns its mesh and the agent.
  local function agent_with(env)
    local a = require("support.agent").start{ token = runtime.token, env = env }
    return mesh_mod.host_mesh(mesh_mod.connect_agents{ a.addr }), a
  end

  local env_of = require("support.procstat").environ

  it("shares the cores out as BLAS and OpenMP threads and spins only with a core per proc, unless told", function()
    local hosts, agent = agent_with("env -u OPENBLAS_NUM_THREADS OMP_NUM_THREADS=5")
    local cpus = tonumber(io.popen("nproc"):read("*l"))
    local procs = hosts:spawn_procs{ procs = 3 }
    for _, p in ipairs(procs:procs()) do
      local e = env_of(p.pid)
      assert.are.equal(tostring(math.max(1, math.floor(cpus / 3))), e:match("OPENBLAS_NUM_THREADS=(%d+)"))
      assert.are.equal("5", e:match("OMP_NUM_THREADS=(%d+)"), "the user's own setting is kept")
      assert.are.equal(3 <= cpus and "50" or "0", e:match("MONARCH_SPIN_US=(%d+)"), "spin only with a core each")
    end
    -- Procs spawned later share what the first left: 3 live + 2 new.
    local more = hosts:spawn_procs{ procs = 2 }
    for _, p in ipairs(more:procs()) do
      assert.are.equal(tostring(math.max(1, math.floor(cpus / 5))), env_of(p.pid):match("OPENBLAS_NUM_THREADS=(%d+)"))
    end
    more:stop()
    procs:stop()
    agent:stop()
  end)
end)
