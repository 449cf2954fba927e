-- Collectives that kernels run themselves (mk_all_reduce ... on a group
-- passed as a 'g' argument; kernels/cpu/kcoll.c), on real procs: the same
-- bytes as the built-in collectives, in order, and failures that reach
-- every member at once with a clear message.
local monarch = require "monarch"

-- Proc i (0-based) holds 10i - 7 + j at element j (u8: i + j).
local function rank_values(m, dtype, numel)
  local t = m:tensor(dtype, { numel })
  for i = 1, m:size() do
    local start = dtype == "u8" and i - 1 or 10 * (i - 1) - 7
    m:slice(m.shape:coords(i)):call("iota", t, start):get()
  end
  return t
end

local function bytes_of(t)
  local out = {}
  for _, h in t:fetch():get():items() do out[#out + 1] = h:bytes() end
  return out
end

local function assert_same(a, b)
  local x, y = bytes_of(a), bytes_of(b)
  assert.are.equal(#x, #y)
  for i = 1, #x do assert.is_true(x[i] == y[i], "proc " .. (i - 1) .. " differs from the built-in collective") end
end

describe("in-kernel collectives", function()
  local procs

  setup(function()
    procs = monarch.hosts():spawn_procs{ procs = 4 }
    procs:load "basic"
    procs:load "kcoll"
  end)

  teardown(function() procs:stop() end)

  for _, n in ipairs({ 2, 4 }) do
    it(string.format("all_reduce gives the built-in's bytes for every op and reducible dtype on %d procs", n), function()
      local m = procs:slice{ procs = { 0, n } }
      local g = m:group()
      assert.are.equal(n, g.size)
      for _, size in ipairs({ 100, 50000 }) do
        for _, dtype in ipairs({ "f32", "f64", "i32", "i64" }) do
          for _, op in ipairs({ "sum", "max", "min", "avg" }) do
            local a, b = rank_values(m, dtype, size), rank_values(m, dtype, size)
            m:call("kc_all_reduce", g, a, op):get()
            m:all_reduce(b, op):get()
            assert_same(a, b)
            a:free()
            b:free()
          end
        end
      end
      g:free()
    end)

    it(string.format("broadcast, all_gather and reduce_scatter give the built-ins' bytes on %d procs", n), function()
      local m = procs:slice{ procs = { 0, n } }
      local g = m:group()
      for _, dtype in ipairs({ "u8", "f32", "f64", "i32", "i64" }) do
        local k = dtype == "u8" and 50 or 1000 -- u8 values stay below 256
        local a, b = rank_values(m, dtype, 3 * k), rank_values(m, dtype, 3 * k)
        m:call("kc_broadcast", g, a, n - 1):get()
        m:broadcast_tensor(b, n - 1):get()
        assert_same(a, b)
        local src = rank_values(m, dtype, k)
        local da, db = m:tensor(dtype, { n * k }), m:tensor(dtype, { n * k })
        m:call("kc_all_gather", g, src, da):get()
        m:all_gather(src, db):get()
        assert_same(da, db)
        if dtype ~= "u8" then
          local ra, rb = m:tensor(dtype, { 1000 }), m:tensor(dtype, { 1000 })
          local big = rank_values(m, dtype, n * 1000)
          m:call("kc_reduce_scatter", g, big, ra, "sum"):get()
          m:reduce_scatter(big, rb, "sum"):get()
          assert_same(ra, rb)
        end
      end
      g:free()
    end)
  end

  it("runs a kernel's collectives in order and tells each member its position", function()
    local g = procs:group()
    local pos = procs:call("kc_barrier", g):get()
    for i = 1, 4 do assert.are.same({ i - 1, 4 }, pos[i]) end
    local t = procs:tensor("f32", { 10 })
    procs:call("fill", t, 0):get()
    procs:call("kc_steps", g, t, 3):get() -- x -> 4x + 10 three times: 10, 50, 210
    for _, h in t:fetch():get():items() do assert.are.equal(210, h.data[0]) end
  end)


  it("reports two members calling different collectives as a mismatch, on every member, at once", function()
    for how, want in pairs({ op = "all_reduce%(max, f32%)", size = "of 2048 bytes",
                             extra = "return %(the end of its kernel%)" }) do
      local g = procs:group()
      local t = procs:tensor("f32", { 1024 })
      local t0 = monarch.now()
      local ok, err = pcall(function() return procs:call("kc_misbehave", g, t, how, 1):get() end)
      assert.is_false(ok)
      assert.are.equal("collective_mismatch", err.kind, tostring(err))
      assert.matches(want, err.message)
      assert.matches("but rank", err.message)
      assert.is_true(monarch.now() - t0 < 5, "took " .. (monarch.now() - t0) .. " s")
      -- The failed call tore the group down: using it again raises at once.
      local ok2, err2 = pcall(procs.call, procs, "kc_barrier", g)
      assert.is_false(ok2)
      assert.matches("tore it down", tostring(err2))
    end
  end)

  it("fails every member at once with the reason when one member's kernel fails before the collective", function()
    local g = procs:group()
    local t = procs:tensor("f32", { 1024 })
    local t0 = monarch.now()
    local ok, err = pcall(function() return procs:call("kc_misbehave", g, t, "fail", 2):get() end)
    assert.is_false(ok)
    assert.matches("fails on purpose", tostring(err))
    for _, f in ipairs(err.failures) do
      if not f.message:find("fails on purpose", 1, true) then
        assert.matches("kernel 'kc_misbehave' failed on rank 2", f.message)
      end
    end
    assert.are.equal(4, #err.failures)
    assert.is_true(monarch.now() - t0 < 5)
  end)

  it("refuses a GPU tensor clearly and fails the others at once", function()
    local g = procs:group()
    local t = procs:tensor("f32", { 256 })
    local ok, err = pcall(function() return procs:call("kc_misbehave", g, t, "gpu", 0):get() end)
    assert.is_false(ok)
    assert.matches("the tensor is on cuda:0 but group %d+ has no NCCL communicator; make the group with " ..
      "mesh:group{ gpu = true }", tostring(err))
  end)

  it("refuses a group made on another mesh before anything runs", function()
    local g = procs:slice{ procs = { 0, 2 } }:group()
    local ok, err = pcall(procs.call, procs, "kc_barrier", g)
    assert.is_false(ok)
    assert.matches("belongs to another mesh", tostring(err))
    local ok2, err2 = pcall(function() return procs:call("kc_barrier", 5):get() end)
    assert.is_false(ok2)
    assert.matches("group 5 does not exist", tostring(err2))
  end)
end)

describe("in-kernel collectives with a member dying", function()
  it("fail the survivors at once, not after the timeout", function()
    for _, n in ipairs({ 2, 4 }) do
      local procs = monarch.hosts():spawn_procs{ procs = n }
      procs:load "kcoll"
      local g = procs:group()
      local t = procs:tensor("f32", { 65536 })
      procs:call("kc_barrier", g):get() -- the tensor exists everywhere before anyone dies
      local t0 = monarch.now()
      local ok, err = pcall(function() return procs:call("kc_misbehave", g, t, "exit", n - 1):get() end)
      local took = monarch.now() - t0
      assert.is_false(ok)
      assert.are.equal("proc_failed", err.kind, tostring(err))
      assert.are.equal(n, #err.failures, tostring(err))
      local survivors = 0
      for _, f in ipairs(err.failures) do
        if f.kind == "collective" then survivors = survivors + 1 end
      end
      assert.are.equal(n - 1, survivors, tostring(err))
      assert.is_true(took < 5, "survivors took " .. took .. " s")
      procs:stop()
    end
  end)
end)
