-- Collectives and proc-to-proc copies between real procs, over their direct links.
local ffi = require "ffi"
local monarch = require "monarch"
local collective = require "monarch.collective"

-- Runs fn(one_proc_mesh, flat_index, coords) for every proc of m.
local function each_proc(m, fn)
  for i = 1, m:size() do
    local c = m.shape:coords(i)
    fn(m:slice(c), i, c)
  end
end

-- Every proc's tensor as a Lua array, in mesh order; also checks that all hold the same bytes when same is set.
local function fetch_all(t)
  local out = {}
  for i, h in t:fetch():get():items() do out[#out + 1] = h end
  return out
end

local function f32(x) return tonumber(ffi.new("float", x)) end

describe("collectives on real procs", function()
  local procs

  setup(function()
    procs = monarch.hosts():spawn_procs{ procs = 4 }
    procs:load "basic"
  end)

  teardown(function()
    procs:stop()
  end)

  -- Proc r holds start_r + i with start_r = 10r - 7: the sums divide evenly by n.
  local function rank_values(m, dtype, numel)
    local t = m:tensor(dtype, { numel })
    each_proc(m, function(one, i) one:call("iota", t, 10 * (i - 1) - 7):get() end)
    return t
  end

  local function expected(op, n, i)
    local s, mx, mn = 0, -math.huge, math.huge
    for r = 0, n - 1 do
      local v = 10 * r - 7 + i
      s, mx, mn = s + v, math.max(mx, v), math.min(mn, v)
    end
    if op == "sum" then return s elseif op == "max" then return mx elseif op == "min" then return mn end
    return s / n
  end

  for _, n in ipairs({ 2, 3, 4 }) do
    for _, size in ipairs({ 100, 50000 }) do -- the star for small tensors, the ring for large ones
      it(string.format("all_reduce sums, maxes, mins and averages %d values over %d procs exactly", size, n), function()
        local m = procs:slice{ procs = { 0, n } }
        for _, op in ipairs({ "sum", "max", "min", "avg" }) do
          for _, dtype in ipairs({ "f32", "i64" }) do
            local t = rank_values(m, dtype, size)
            assert.is_nil(m:all_reduce(t, op):get())
            local hs = fetch_all(t)
            for i = 0, size - 1, size > 1000 and 97 or 1 do
              local want = expected(op, n, i)
              if dtype == "i64" then want = want >= 0 and math.floor(want) or math.ceil(want) end
              assert.are.equal(dtype == "f32" and f32(want) or want, hs[1][i + 1])
            end
            local bytes = hs[1]:bytes()
            for r = 2, n do assert.is_true(bytes == hs[r]:bytes(), "rank " .. (r - 1) .. " differs from rank 0") end
            t:free()
          end
        end
      end)
    end
  end

  it("all_reduce gives the same bytes run after run", function()
    local t = procs:tensor("f32", { 30001 })
    local first
    for run = 1, 3 do
      each_proc(procs, function(one, i) one:call("iota", t, 0.1 * i):get() end)
      procs:all_reduce(t, "sum"):get()
      local b = fetch_all(t)[3]:bytes()
      first = first or b
      assert.is_true(first == b, "run " .. run .. " differs")
    end
  end)

  it("all_reduce of a large tensor (8 Mi floats) is right in every element", function()
    local n = 8 * 1024 * 1024
    local t, e = procs:tensor("f32", { n }), procs:tensor("f32", { n })
    each_proc(procs, function(one, i) one:call("fill", t, i):get() end) -- ranks hold 1, 2, 3, 4
    procs:all_reduce(t, "sum"):get()
    procs:call("fill", e, 10):get()
    procs:call("axpy", -1, e, t):get() -- t - 10 is zero everywhere iff every element is right
    for _, d in ipairs(procs:call("dot", t, t):get():values()) do assert.are.equal(0, d) end
    t:free()
    e:free()
  end)

  it("broadcast_tensor copies a non-zero root's tensor to every proc", function()
    local t = rank_values(procs, "f64", 200000)
    procs:broadcast_tensor(t, { procs = 2 }):get()
    for _, h in ipairs(fetch_all(t)) do
      assert.are.equal(13, h[1])
      assert.are.equal(13 + 199999, h[200000])
    end
    t = rank_values(procs, "f64", 2000)
    procs:broadcast_tensor(t, 1):get() -- a 0-based position works too
    assert.are.equal(3, fetch_all(t)[4][1])
  end)

  it("all_gather concatenates every proc's tensor in rank order", function()
    local src = rank_values(procs, "i32", 5)
    local dst = procs:tensor("i32", { 20 })
    procs:all_gather(src, dst):get()
    local want = {}
    for r = 0, 3 do for i = 0, 4 do want[#want + 1] = 10 * r - 7 + i end end
    for _, h in ipairs(fetch_all(dst)) do assert.are.same(want, h:totable()) end
  end)

  it("reduce_scatter leaves block r of the reduction on rank r", function()
    local src = rank_values(procs, "f64", 4 * 40000)
    local dst = procs:tensor("f64", { 40000 })
    procs:reduce_scatter(src, dst, "sum"):get()
    for r, h in ipairs(fetch_all(dst)) do
      local base = (r - 1) * 40000
      assert.are.equal(expected("sum", 4, base), h[1])
      assert.are.equal(expected("sum", 4, base + 39999), h[40000])
    end
    assert.are.equal(-7, fetch_all(src)[1][1]) -- src unchanged
  end)

  it("barrier completes only once every proc reached it", function()
    local t0 = monarch.now()
    procs:slice{ procs = 3 }:call("sleep", 0.3)
    procs:barrier():get()
    assert.is_true(monarch.now() - t0 >= 0.3)
  end)

  it("copy moves a tensor from one proc to another, directly", function()
    for _, n in ipairs({ 1000, 300000 }) do -- over TCP, and (from 1 MB, on one host) read from the source's memory
      local src = rank_values(procs, "f32", n)
      local dst = procs:tensor("f32", { n })
      procs:copy(src, { procs = 1 }, dst, { procs = 3 }):get()
      local hs = fetch_all(dst)
      assert.is_true(hs[4]:bytes() == fetch_all(src)[2]:bytes())
      assert.are.equal(3 + n - 1, hs[4][n])
      assert.are.equal(0, hs[1][1]) -- the others' dst untouched
    end
    local src = rank_values(procs, "f32", 100000)
    local dst = procs:tensor("f32", { 100000 })
    procs:copy(src, 2, dst, 2):get() -- within one proc
    assert.are.equal(13, fetch_all(dst)[3][1])
  end)

  it("copy refuses tensors of different sizes before sending anything", function()
    local a, b = procs:tensor("f32", { 10 }), procs:tensor("f32", { 11 })
    assert.has_error(function() procs:copy(a, 0, b, 1) end, "copy: src is f32 with 10 elements but dst is f32 with 11")
  end)

  it("refuses a dtype it cannot reduce, naming it", function()
    local t = procs:tensor("u8", { 4 })
    assert.has_error(function() procs:all_reduce(t, "sum") end, "all_reduce does not support dtype u8 (f32, f64, i32, i64)")
    assert.has_error(function() procs:all_reduce(procs:tensor("f32", { 4 }), "prod") end,
      "all_reduce: unknown op prod (sum, max, min, avg)")
    -- The procs say so too when asked directly.
    local two = procs:slice{ procs = { 0, 2 } }
    local gid = collective.setup_groups(two)[1]
    local ok, err = pcall(function() return two:call("__coll_all_reduce", gid, t, "sum"):get() end)
    assert.is_false(ok)
    assert.matches("all_reduce does not support dtype u8", err.message, 1, true)
  end)

  it("reports two procs calling different collectives as a mismatch, then recovers", function()
    local two = procs:slice{ procs = { 0, 2 } }
    local gid = collective.setup_groups(two)[1]
    local big, small = two:tensor("f32", { 1024 }), two:tensor("f32", { 4 })
    local fa = two:slice{ procs = 0 }:call_one("__coll_all_reduce", gid, big, "sum")
    local fb = two:slice{ procs = 1 }:call_one("__coll_broadcast", gid, small, 0)
    for _, f in ipairs({ fa, fb }) do
      local ok, err = pcall(f.get, f)
      assert.is_false(ok)
      assert.are.equal("collective_mismatch", err.kind)
      local m = tostring(err.message)
      assert.is_true(m:find("called all_reduce%(sum, f32%) of 4096 bytes but rank %d called broadcast%(root 0, f32%) of 16 bytes") ~= nil
        or m:find("called broadcast%(root 0, f32%) of 16 bytes but rank %d called all_reduce%(sum, f32%) of 4096 bytes") ~= nil, m)
    end
    -- The high-level calls set up their own groups and keep working.
    two:call("fill", big, 2):get()
    two:all_reduce(big, "sum"):get()
    assert.are.equal(4, fetch_all(big)[2][1024])
  end)

  it("tells the other members at once when one member cannot take part", function()
    local two = procs:slice{ procs = { 0, 2 } }
    local gid = collective.setup_groups(two)[1]
    local t = two:tensor("f32", { 100 })
    local t0 = monarch.now()
    local fa = two:slice{ procs = 0 }:call_one("__coll_all_reduce", gid, 999999, "sum") -- no such tensor
    local fb = two:slice{ procs = 1 }:call_one("__coll_all_reduce", gid, t, "sum")
    local ok, err = pcall(fa.get, fa)
    assert.is_false(ok)
    assert.matches("tensor 999999 does not exist", err.message, 1, true)
    ok, err = pcall(fb.get, fb)
    assert.is_false(ok)
    assert.matches("rank 0 gave up on group", err.message, 1, true)
    assert.matches("tensor 999999 does not exist", err.message, 1, true)
    assert.is_true(monarch.now() - t0 < 5)
  end)

  it("rejects options it does not know and dimensions the mesh lacks", function()
    local t = procs:tensor("f32", { 4 })
    assert.has_error(function() procs:all_reduce(t, "sum", { dims = "x" }) end,
      "all_reduce: unknown option 'dims' (known: dim, timeout)")
    assert.has_error(function() procs:all_reduce(t, "sum", { dim = "dp" }) end)
  end)
end)

describe("collectives along one dimension of a {dp, tp} mesh", function()
  local mesh

  setup(function()
    mesh = monarch.hosts():spawn_procs{ { "dp", 2 }, { "tp", 2 } }
    mesh:load "basic"
  end)

  teardown(function()
    mesh:stop()
  end)

  it("all_reduce over dp sums each tp column separately", function()
    local t = mesh:tensor("f64", { 1000 })
    each_proc(mesh, function(one, _, c) one:call("fill", t, 100 * c.dp + c.tp):get() end)
    mesh:all_reduce(t, "sum", { dim = "dp" }):get()
    for coords, h in t:fetch():get():items() do
      assert.are.equal(100 + 2 * coords.tp, h[1000]) -- (0 + tp) + (100 + tp)
    end
    each_proc(mesh, function(one, _, c) one:call("fill", t, 100 * c.dp + c.tp):get() end)
    mesh:all_reduce(t, "max", { dim = "tp" }):get()
    for coords, h in t:fetch():get():items() do assert.are.equal(100 * coords.dp + 1, h[1]) end
  end)

  it("broadcast_tensor along tp takes the root's coordinate on that dimension", function()
    local t = mesh:tensor("i32", { 3 })
    each_proc(mesh, function(one, i) one:call("fill", t, i):get() end)
    mesh:broadcast_tensor(t, { tp = 1 }, { dim = "tp" }):get()
    for coords, h in t:fetch():get():items() do assert.are.equal(2 * coords.dp + 2, h[1]) end
  end)
end)

describe("a collective whose member dies", function()
  it("fails on every member instead of hanging", function()
    local m = monarch.hosts():spawn_procs{ procs = 3 }
    m:load "basic"
    m:load "faulty"
    local t = m:tensor("f32", { 100000 })
    m:all_reduce(t, "sum"):get() -- the group is up
    m:slice{ procs = 2 }:call("exit", 3)
    local t0 = monarch.now()
    local ok, err = pcall(function() return m:all_reduce(t, "sum"):get() end)
    assert.is_false(ok)
    assert.is_true(monarch.now() - t0 < 10)
    assert.are.equal(2, err.rank)
    assert.are.equal(2, err.others)
    m:stop()
  end)
end)

-- Two host agents with different host keys stand for two machines: each
-- host's procs sum in shared memory, one leader per host crosses the link.
describe("collectives over two hosts with two procs each", function()
  local mesh_mod = require "monarch.mesh"
  local runtime = require "monarch.runtime"
  local agent = require "support.agent"
  local a, b, procs

  setup(function()
    monarch.hosts()
    a = agent.start{ token = runtime.token, env = "MONARCH_HOST_KEY=spec-host-a" }
    b = agent.start{ token = runtime.token, env = "MONARCH_HOST_KEY=spec-host-b" }
    procs = mesh_mod.host_mesh(mesh_mod.connect_agents{ a.addr, b.addr }):spawn_procs{ procs = 2 }
    procs:load "basic"
    procs:load "faulty"
  end)

  teardown(function()
    if procs then procs:stop() end
    a:stop()
    b:stop()
  end)

  it("lays the group out by host", function()
    local gid = collective.setup_groups(procs)[1]
    for _, l in ipairs(procs:call("__coll_layout", gid):get():values()) do assert.are.equal("hosts", l) end
    local one = collective.setup_groups(procs:slice{ hosts = 0 })[1]
    for _, l in ipairs(procs:slice{ hosts = 0 }:call("__coll_layout", one):get():values()) do
      assert.are.equal("one host", l)
    end
  end)

  it("all_reduces exactly, with the same bytes on every proc, large and small", function()
    for _, numel in ipairs({ 262144, 1000 }) do -- 2 MiB of f64 by host, 8 KB by the star
      for _, op in ipairs({ "sum", "avg", "max" }) do
        local t = procs:tensor("f64", { numel })
        each_proc(procs, function(one, i) one:call("iota", t, 10 * (i - 1) - 7):get() end)
        procs:all_reduce(t, op):get()
        for _, h in ipairs(fetch_all(t)) do
          for _, e in ipairs({ 1, math.floor(numel / 2), numel }) do
            local s, mx = 0, -math.huge
            for r = 0, 3 do s, mx = s + (10 * r - 7 + e - 1), math.max(mx, 10 * r - 7 + e - 1) end
            assert.are.equal(op == "sum" and s or op == "avg" and s / 4 or mx, h[e], op .. " element " .. e)
          end
        end
        -- Values whose sums round: every proc still holds the same bytes.
        each_proc(procs, function(one, i) one:call("iota", t, 0.1 * i):get() end)
        procs:all_reduce(t, op):get()
        local all = fetch_all(t)
        for r = 2, 4 do assert.is_true(all[1]:bytes() == all[r]:bytes(), op .. ": proc " .. r .. " differs") end
        t:free()
      end
    end
  end)

  -- Procs 1, 2 on host a and 3, 4 on host b; 1 and 3 lead their hosts.
  for _, victim in ipairs({ 4, 3 }) do
    it(("fails on every member at once when %s of the other host dies"):format(victim == 3 and "the leader" or "a proc"),
      function()
        local m = mesh_mod.host_mesh(mesh_mod.connect_agents{ a.addr, b.addr }):spawn_procs{ procs = 2 }
        m:load "basic"
        local t = m:tensor("f32", { 1048576 })
        m:all_reduce(t, "sum"):get()
        m:on_failure(function() end)
        os.execute("kill -9 " .. m:procs()[victim].pid)
        local t0 = monarch.now()
        local ok = pcall(function() return m:all_reduce(t, "sum"):get() end)
        assert.is_false(ok)
        assert.is_true(monarch.now() - t0 < 10, "took " .. (monarch.now() - t0) .. " s")
        m:stop()
      end)
  end
end)
