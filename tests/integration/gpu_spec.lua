-- GPU procs on real worker processes: CUDA tensors, the cuda_basic kernel
-- library checked against the same arithmetic done on the CPU (in Lua), and
-- NCCL collectives. Where the host has no GPU, every test that needs one is
-- pending with the reason the proc gave (no CUDA runtime, no device); the
-- tests of that reason itself run everywhere.
local monarch = require "monarch"
local gpu = require "monarch.gpu"

local wait_for = require("support.wait").wait_for
local build = os.getenv("MONARCH_BUILD") or "build"

local function file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- A deterministic pseudo-random sequence (Park-Miller, exact in doubles), so
-- failures reproduce; values are multiples of 1/256 in [-4, 4], exact in f32.
local function values(n, seed)
  local out, s = {}, seed
  for i = 1, n do
    s = (s * 16807) % 2147483647
    out[i] = (s % 2049 - 1024) / 256
  end
  return out
end

-- Row-major C = alpha * op(A) @ op(B) + beta * C in double, and per element
-- the sum of the magnitudes that went in (what f32 rounding scales with).
local function gemm(A, B, C, m, n, k, alpha, beta, ta, tb)
  local out, mag = {}, {}
  for i = 0, m - 1 do
    for j = 0, n - 1 do
      local s, a_s = 0, 0
      for p = 0, k - 1 do
        local a = ta and A[p * m + i + 1] or A[i * k + p + 1]
        local b = tb and B[j * k + p + 1] or B[p * n + j + 1]
        s, a_s = s + a * b, a_s + math.abs(a * b)
      end
      local c = C[i * n + j + 1]
      out[i * n + j + 1] = alpha * s + beta * c
      mag[i * n + j + 1] = math.abs(alpha) * a_s + math.abs(beta * c)
    end
  end
  return out, mag
end

-- Checks |want - got| <= tol * scale element by element (scale defaults to max(1, |want|)).
local function assert_close(want, got, tol, what, scales)
  assert.are.equal(#want, #got, what .. ": lengths differ")
  for i = 1, #want do
    local scale = scales and math.max(1, scales[i]) or math.max(1, math.abs(want[i]))
    if math.abs(want[i] - got[i]) > tol * scale then
      error(string.format("%s: element %d is %.9g, want %.9g", what, i, got[i], want[i]), 2)
    end
  end
end

describe("GPU procs", function()
  local procs, info, why

  setup(function()
    procs = monarch.hosts():spawn_procs{ procs = 1 }
    info, why = gpu.info(procs)
    if info then
      print(string.format("\n  GPU: %s, %d device(s), %.1f GiB, compute %s, CUDA runtime %d, driver %d",
        info.name, info.count, info.total_bytes / 2 ^ 30, info.capability, info.runtime_version, info.driver_version))
      procs:load "cuda_basic"
    else
      print("\n  GPU specs pending: " .. tostring(why))
    end
  end)

  teardown(function() procs:stop() end)

  local function need_gpu()
    if not info then pending("no GPU: " .. tostring(why)) end
  end

  it("answers gpu_info with a device, or with the reason there is none", function()
    if info then
      assert.is_true(info.count >= 1)
      assert.is_true(#info.name > 0)
      assert.is_true(info.total_bytes > 0 and info.free_bytes <= info.total_bytes)
      assert.matches("^%d+%.%d+$", info.capability)
    else
      assert.matches("^no CUDA", why)
    end
  end)

  it("refuses GPU tensors with that reason where there is no GPU", function()
    if info then pending("this host has a GPU") end
    local t = procs:gpu_tensor("f32", { 4 })
    local ok, err = pcall(function() return t:fetch():get() end)
    t:free()
    assert.is_false(ok)
    assert.matches("no CUDA", tostring(err))
  end)

  it("cuda_basic refuses a CPU tensor by name", function()
    if not file_exists(build .. "/lib/monarch/cuda_basic.so") then pending("cuda_basic.so not built (no CUDA toolkit)") end
    local cpu = monarch.hosts():spawn_procs{ procs = 1 }
    local ok, err = pcall(cpu.load, cpu, "cuda_basic")
    if not ok then
      cpu:stop()
      pending("cuda_basic does not load here: " .. tostring(err))
    end
    local t = cpu:tensor("f32", { 4 })
    local ok2, err2 = pcall(function() return cpu:call("fill", t, 1):get() end)
    t:free()
    cpu:stop()
    assert.is_false(ok2)
    assert.matches("fill: cuda_basic is a GPU library; tensor %d+ is on the CPU", tostring(err2))
  end)

  it("rejects a GPU tensor of an unknown dtype or a bad shape before sending", function()
    assert.has_error(function() procs:gpu_tensor("f33", { 2 }) end,
      "unknown dtype 'f33' (f32, f64, f16, bf16, i32, i64, u8)")
    assert.has_error(function() procs:gpu_tensor("f32", { 2, -1 }) end,
      "tensor shape entry 2 must be a non-negative integer, got -1")
    local c = procs:tensor("f32", { 2 })
    local ok, err = pcall(function() return procs:gpu_all_reduce(c, "sum") end)
    c:free()
    assert.is_false(ok)
    assert.matches("gpu_all_reduce: the tensor must be a GPU tensor %(ProcMesh:gpu_tensor%), got a CPU tensor", tostring(err))
  end)

  it("fills, counts, scales and sums a GPU tensor as the CPU does", function()
    need_gpu()
    local n = 100000
    local t = procs:gpu_tensor("f64", { n })
    procs:call("iota", t, 1):get()
    assert.are.equal(n * (n + 1) / 2, procs:call("sum", t):get()[1])
    procs:call("scale", t, 0.5):get()
    assert.are.equal(n * (n + 1) / 4, procs:call("sum", t):get()[1])
    local h = t:fetch():get()[1]
    assert.are.equal(0.5, h[1])
    assert.are.equal(n / 2, h[n])
    local u = procs:gpu_tensor("u8", { 300 })
    procs:call("fill", u, 255):get()
    assert.are.equal(255 * 300, procs:call("sum", u):get()[1])
    local ok, err = pcall(function() return procs:call("fill", u, 256):get() end)
    assert.is_false(ok)
    assert.matches("fill: value 256 does not fit in u8", tostring(err))
    t:free()
    u:free()
  end)

  it("runs axpy and dot in f32 and f64 and matches the CPU", function()
    need_gpu()
    for _, dtype in ipairs({ "f32", "f64" }) do
      local n = 4097
      local xs, ys = values(n, 1), values(n, 2)
      local x, y = procs:gpu_tensor(dtype, { n }), procs:gpu_tensor(dtype, { n })
      x:put(xs):get()
      y:put(ys):get()
      procs:call("axpy", 1.5, x, y):get()
      local want, dot = {}, 0
      for i = 1, n do
        want[i] = 1.5 * xs[i] + ys[i]
        dot = dot + xs[i] * want[i]
      end
      assert_close(want, y:fetch():get()[1]:totable(), 1e-6, dtype .. " axpy")
      assert_close({ dot }, { procs:call("dot", x, y):get()[1] }, 1e-6, dtype .. " dot")
      x:free()
      y:free()
    end
  end)

  it("multiplies row-major matrices with sgemm (cuBLAS), transposes, alpha and beta included", function()
    need_gpu()
    local m, n, k = 37, 23, 19
    for _, case in ipairs({ { false, false }, { true, false }, { false, true }, { true, true } }) do
      local ta, tb = case[1], case[2]
      local As, Bs, Cs = values(m * k, 3), values(k * n, 4), values(m * n, 5)
      local A = procs:gpu_tensor("f32", ta and { k, m } or { m, k })
      local B = procs:gpu_tensor("f32", tb and { n, k } or { k, n })
      local C = procs:gpu_tensor("f32", { m, n })
      A:put(As):get()
      B:put(Bs):get()
      C:put(Cs):get()
      procs:call("sgemm", A, B, C, 2, 0.5, ta, tb):get()
      local want, mag = gemm(As, Bs, Cs, m, n, k, 2, 0.5, ta, tb)
      assert_close(want, C:fetch():get()[1]:totable(), 4e-6,
        string.format("sgemm ta=%s tb=%s", tostring(ta), tostring(tb)), mag)
      A:free()
      B:free()
      C:free()
    end
    local A, C = procs:gpu_tensor("f32", { 3, 4 }), procs:gpu_tensor("f32", { 3, 3 })
    local ok, err = pcall(function() return procs:call("sgemm", A, A, C):get() end)
    assert.is_false(ok)
    assert.matches("sgemm: A is 3x4 but B is 3x4 %(inner dimensions differ%)", tostring(err))
  end)

  it("puts and fetches raw bytes of every dtype unchanged", function()
    need_gpu()
    for dtype, d in pairs(require("monarch.tensor").dtypes) do
      local bytes = {}
      for i = 1, 8 * d.size do bytes[i] = string.char((i * 37) % 256) end
      local s = table.concat(bytes)
      local t = procs:gpu_tensor(dtype, { 8 })
      t:put(s):get()
      assert.are.equal(s, t:fetch():get()[1]:bytes(), dtype)
      t:free()
    end
  end)

  it("all-reduces, broadcasts, gathers and scatters with NCCL on one rank", function()
    need_gpu()
    local t = procs:gpu_tensor("f32", { 1000 })
    procs:call("fill", t, 3):get()
    for _, op in ipairs({ "sum", "max", "min", "avg" }) do
      procs:gpu_all_reduce(t, op):get()
      assert.are.equal(3000, procs:call("sum", t):get()[1], op)
    end
    procs:gpu_broadcast(t, 0):get()
    local g = procs:gpu_tensor("f32", { 1000 })
    procs:gpu_all_gather(t, g):get()
    assert.are.equal(3000, procs:call("sum", g):get()[1])
    procs:call("fill", g, 1):get()
    procs:gpu_reduce_scatter(g, t, "sum"):get()
    assert.are.equal(1000, procs:call("sum", t):get()[1])
    local ok, err = pcall(function() return procs:gpu_all_reduce(t, "prod") end)
    assert.is_false(ok)
    assert.matches("gpu_all_reduce: unknown op prod (sum, max, min, avg)", tostring(err), 1, true)
    t:free()
    g:free()
  end)

  it("runs NCCL inside a kernel on a gpu group (all_reduce_inplace)", function()
    need_gpu()
    local g = procs:group{ gpu = true }
    local t = procs:gpu_tensor("f32", { 1000 })
    procs:call("fill", t, 3):get()
    procs:call("all_reduce_inplace", g, t):get()
    assert.are.equal(3000, procs:call("sum", t):get()[1])
    local cpu = procs:tensor("f32", { 4 })
    local ok, err = pcall(function() return procs:call("all_reduce_inplace", g, cpu):get() end)
    assert.is_false(ok)
    assert.matches("cuda_basic is a GPU library", tostring(err))
    g:free()
    if info.count >= 2 then
      local two = monarch.hosts():spawn_procs{ procs = 2, gpus = 2 }
      two:load "cuda_basic"
      local g2 = two:group{ gpu = true }
      local t2 = two:gpu_tensor("f32", { 2 ^ 20 })
      two:call("fill", t2, 1):get()
      two:call("all_reduce_inplace", g2, t2):get()
      assert.are.same({ 2 * 2 ^ 20, 2 * 2 ^ 20 }, two:call("sum", t2):get():values())
      g2:free()
      two:stop()
    end
  end)

  it("all-reduces across two procs with a GPU each", function()
    need_gpu()
    if info.count < 2 then pending("needs 2 GPUs, this host has " .. info.count .. " (NCCL takes one rank per GPU)") end
    local ok, two = pcall(function() return monarch.hosts():spawn_procs{ procs = 2, gpus = 2 } end)
    if not ok then pending("spawn_procs{gpus = N} is not available: " .. tostring(two)) end
    two:load "cuda_basic"
    local t = two:gpu_tensor("f32", { 2 ^ 20 })
    two:call("fill", t, 1):get()
    two:gpu_all_reduce(t, "sum"):get()
    assert.are.same({ 2 * 2 ^ 20, 2 * 2 ^ 20 }, two:call("sum", t):get():values())
    two:stop()
  end)

  -- examples/train.lua with --device gpu: one proc per GPU, cuda_mlp, NCCL.
  -- The data file is git-ignored and a GPU machine may not reach the network,
  -- so a digits-like synthetic set stands in when data/digits.csv.gz is absent.
  it("trains examples/train.lua on the GPU, reproducibly, as well as on the CPU", function()
    need_gpu()
    if not file_exists(build .. "/lib/monarch/cuda_mlp.so") then pending("cuda_mlp.so not built (no CUDA toolkit)") end
    local dir = os.tmpname()
    os.remove(dir)
    local data_arg = ""
    if not file_exists("data/digits.csv.gz") then -- no fetch: a GPU machine may not reach the network
      require("support.digits").synthetic(dir .. ".csv")
      data_arg = " --data " .. dir .. ".csv"
    end
    local function train(args)
      local f = io.popen(string.format("timeout 60 %s/bin/monarch-run examples/train.lua --steps 150 --every 50 " ..
        "--checkpoint-dir %s%s %s 2>&1; echo \"::rc=$?\"", build, dir, data_arg, args))
      local out = f:read("*a")
      f:close()
      local rc = tonumber(out:match("::rc=(%d+)%s*$"))
      assert.are.equal(0, rc, out)
      return out, tonumber(out:match("test accuracy ([%d.]+)%%")) / 100,
        out:match("weights identical on all %d+ procs %(%d+ parameters, crc32 (%x+)%)")
    end
    local out, acc, crc = train("--device gpu")
    local again, acc2, crc2 = train("--device gpu --quiet")
    local world = tonumber(out:match("training on (%d+) procs"))
    local _, cpu_acc = train("--device cpu --procs " .. world)
    os.execute("rm -rf '" .. dir .. "' '" .. dir .. ".csv'")
    assert.matches("device: gpu, %d+ x .* per host %(cuda_mlp", out)
    assert.are.equal(info.count, world, "one proc per GPU")
    assert.matches("checkpoint: .*ckpt%-000000150%.bin", out)
    assert.is_true(acc >= 0.9, out)
    assert.is_true(acc >= cpu_acc - 0.03, string.format("GPU %.4f vs CPU %.4f", acc, cpu_acc))
    assert.are.equal(crc, crc2, "two GPU runs with one seed ended with different weights:\n" .. again)
    assert.are.equal(acc, acc2)
  end)

  it("names the limit when two procs share one GPU", function()
    need_gpu()
    if info.count ~= 1 then pending("the host has " .. info.count .. " GPUs") end
    local two = monarch.hosts():spawn_procs{ procs = 2 }
    local old = gpu.init_timeout
    gpu.init_timeout = 60
    local ok, err = pcall(function()
      local t = two:gpu_tensor("f32", { 16 })
      return two:gpu_all_reduce(t, "sum"):get()
    end)
    gpu.init_timeout = old
    two:stop()
    assert.is_false(ok)
    assert.matches("ncclCommInitRank failed", tostring(err))
  end)
end)

-- The same built-ins and monarch.gpu on every machine: procs of a host agent
-- of our own load the fake CUDA runtime and NCCL that mk/cuda.mk builds from
-- tests/c/fake_gpu.c (host memory for device memory; each proc its own fake
-- device). A fake f32 all_reduce writes what its communicator is into the
-- tensor: {nranks, rank, pid of the proc that made the NCCL id, id serial}.
describe("GPU built-ins on a fake CUDA runtime", function()
  local mesh_mod = require "monarch.mesh"
  local runtime = require "monarch.runtime"
  local dir = build:sub(1, 1) == "/" and build or (os.getenv("PWD") or ".") .. "/" .. build
  local fake = dir .. "/tests/libmonarch_fakegpu.so"
  local hung = os.tmpname() -- the fake appends a proc's pid here when its all_reduce of 17 starts to hang
  local hosts, procs, daemon, no_hooks

  setup(function()
    if not file_exists(fake) then return end
    -- An empty CUDA_VISIBLE_DEVICES: every fake device visible, whatever this machine has set.
    daemon = require("support.agent").start{ token = runtime.token,
      env = string.format("MONARCH_CUDART='%s' MONARCH_NCCL='%s' MONARCH_FAKEGPU_HUNG='%s' CUDA_VISIBLE_DEVICES=",
        fake, fake, hung) }
    hosts = mesh_mod.host_mesh(mesh_mod.connect_agents{ daemon.addr })
    procs = hosts:spawn_procs{ { "dp", 2 }, { "tp", 2 } }
    -- A proc built without the registry's device hooks (MN_DEVICE_HOOKS) holds no GPU tensors.
    local t = procs:gpu_tensor("u8", { 1 })
    local ok, err = pcall(function() return t:fetch():get() end)
    t:free()
    if not ok and tostring(err):find("device hooks", 1, true) then no_hooks = tostring(err) end
  end)

  teardown(function()
    if procs then procs:stop() end
    if daemon then daemon:stop() end
    os.remove(hung)
  end)

  -- Empties the file of hung all_reduces; then hung_in(n) waits until n procs wait on their streams there.
  local function hung_reset() assert(io.open(hung, "wb")):close() end
  local function hung_in(n)
    wait_for(function()
      local f = assert(io.open(hung, "rb"))
      local _, lines = f:read("*a"):gsub("\n", "")
      f:close()
      return lines >= n
    end, 10, n .. " procs to wait on their streams in the all_reduce")
  end

  local function need_fake(tensors)
    if not procs then pending(fake .. " is not built (make tests)") end
    if tensors ~= false and no_hooks then pending(no_hooks) end
  end

  -- What each proc's f32 all_reduce of t left behind, in rank order.
  local function comm_of(t)
    local out = {}
    for i, h in ipairs(t:fetch():get():values()) do out[i] = { h[1], h[2], h[3], h[4] } end
    return out
  end

  local function pid_of(rank) return procs:procs()[rank + 1].pid end

  it("reports the fake device through gpu_info on every proc", function()
    need_fake(false)
    for _, v in ipairs(procs:gpu_info():get():values()) do
      assert.are.same({ 1, "Fake GPU", "9.0", 0 }, { v.count, v.name, v.capability, v.device })
    end
  end)

  it("pins procs spawned with gpus = N to one device each", function()
    need_fake(false)
    local ok, two = pcall(function() return hosts:spawn_procs{ procs = 2, gpus = 2 } end)
    if not ok then pending("spawn_procs{gpus = N} is not available yet: " .. tostring(two)) end
    local names = {}
    for i, v in ipairs(two:gpu_info():get():values()) do names[i] = v.name end
    two:stop()
    assert.are.same({ "Fake GPU (CUDA_VISIBLE_DEVICES=0)", "Fake GPU (CUDA_VISIBLE_DEVICES=1)" }, names)
    local ok3, err = pcall(function() return hosts:spawn_procs{ procs = 3, gpus = 2 } end)
    assert.is_false(ok3, "3 procs on 2 GPUs were spawned")
    assert.matches("gpus", tostring(err))
  end)

  it("keeps GPU tensors beside CPU tensors and moves their bytes both ways", function()
    need_fake()
    local t, c = procs:gpu_tensor("f32", { 8 }), procs:tensor("f32", { 8 })
    t:put({ 1, 2, 3, 4, 5, 6, 7, 8 }):get()
    for _, h in ipairs(t:fetch():get():values()) do assert.are.same({ 1, 2, 3, 4, 5, 6, 7, 8 }, h:totable()) end
    for _, h in ipairs(c:fetch():get():values()) do assert.are.same({ 0, 0, 0, 0, 0, 0, 0, 0 }, h:totable()) end
    assert.are.equal(2, procs:call("__info"):get()[1][5])
    t:free()
    c:free()
    local g = procs:gpu_tensor("u8", { 3 })
    assert.are.equal(1, procs:call("__info"):get()[1][5])
    g = nil
    collectgarbage()
    collectgarbage()
    assert.are.equal(0, procs:call("__info"):get()[1][5], "the collected GPU tensor was freed")
    local ok, err = pcall(function() return t:fetch() end)
    assert.is_false(ok)
    assert.matches("GPU tensor %d+ was freed", tostring(err))
  end)

  it("bootstraps one communicator over the whole mesh, ranked in mesh order", function()
    need_fake()
    local t = procs:gpu_tensor("f32", { 4 })
    procs:gpu_all_reduce(t, "sum"):get()
    local c = comm_of(t)
    for r = 0, 3 do assert.are.same({ 4, r, pid_of(0), c[1][4] }, c[r + 1]) end
    t:free()
  end)

  it("bootstraps one communicator per group along a dimension, and reuses it", function()
    need_fake()
    local t = procs:gpu_tensor("f32", { 4 })
    procs:gpu_all_reduce(t, "max", { dim = "tp" }):get()
    local c = comm_of(t)
    -- tp groups: ranks {0, 1} and {2, 3}; each id comes from the group's first proc.
    assert.are.same({ 2, 0, pid_of(0) }, { c[1][1], c[1][2], c[1][3] })
    assert.are.same({ 2, 1, pid_of(0) }, { c[2][1], c[2][2], c[2][3] })
    assert.are.same({ 2, 0, pid_of(2) }, { c[3][1], c[3][2], c[3][3] })
    assert.are.same({ 2, 1, pid_of(2) }, { c[4][1], c[4][2], c[4][3] })
    assert.are.equal(c[1][4], c[2][4])
    assert.are.equal(c[3][4], c[4][4])
    procs:gpu_all_reduce(t, "sum", { dim = "tp" }):get()
    assert.are.same(c, comm_of(t), "the second call made a new communicator")
    procs:gpu_all_reduce(t, "sum", { dim = "dp" }):get()
    local d = comm_of(t)
    assert.are.same({ 2, 0, pid_of(0) }, { d[1][1], d[1][2], d[1][3] })
    assert.are.same({ 2, 0, pid_of(1) }, { d[2][1], d[2][2], d[2][3] })
    assert.are.same({ 2, 1, pid_of(0) }, { d[3][1], d[3][2], d[3][3] })
    assert.are.same({ 2, 1, pid_of(1) }, { d[4][1], d[4][2], d[4][3] })
    local ok, err = pcall(function() return procs:gpu_all_reduce(t, "sum", { dim = "pp" }) end)
    assert.is_false(ok)
    assert.matches("no dimension named 'pp'", tostring(err))
    t:free()
  end)

  it("drops a communicator whose collective failed and makes a new one next time", function()
    need_fake()
    local t, bad = procs:gpu_tensor("f32", { 4 }), procs:gpu_tensor("f32", { 13 })
    procs:gpu_all_reduce(t, "sum"):get()
    local before = comm_of(t)[1][4]
    local ok, err = pcall(function() return procs:gpu_all_reduce(bad, "sum"):get() end)
    assert.is_false(ok)
    assert.matches("__gpu_all_reduce failed: invalid usage", tostring(err))
    procs:gpu_all_reduce(t, "sum"):get()
    assert.are_not.equal(before, comm_of(t)[1][4])
    t:free()
    bad:free()
  end)

  it("aborts a collective as soon as a peer dies instead of waiting out the timeout", function()
    need_fake()
    local three = hosts:spawn_procs{ procs = 3 }
    three:on_failure(function() end)
    local t = three:gpu_tensor("f32", { 17 }) -- the fake's all_reduce of 17 never completes: as with a dead peer
    hung_reset()
    local f = three:gpu_all_reduce(t, "sum")
    hung_in(3)
    local survivors = three:slice{ procs = { 0, 2 } }
    os.execute("kill -9 " .. three:procs()[3].pid)
    local t0 = monarch.now()
    local ok, err = pcall(f.get, f)
    assert.is_false(ok)
    -- MN_GPU_COLL_TIMEOUT_S is 300 s: only the watch group's links can end it this soon.
    assert.is_true(monarch.now() - t0 < 10, "took " .. (monarch.now() - t0) .. " s")
    local msgs = { tostring(err) }
    for _, e in ipairs(err.failures or {}) do msgs[#msgs + 1] = tostring(e) end
    assert.matches("closed its link during __gpu_all_reduce %(it failed or died%); communicator %d+ aborted",
      table.concat(msgs, "\n"))
    -- The survivors were not stuck: they answer at once.
    for _, v in ipairs(survivors:gpu_info():get():values()) do assert.are.equal("Fake GPU", v.name) end
    three:stop()
  end)

  it("runs a kernel's all_reduce on GPU tensors through its gpu group's communicator", function()
    need_fake()
    local two = hosts:spawn_procs{ procs = 2 }
    two:load "kcoll"
    local g = two:group{ gpu = true }
    assert.is_true(g.gpu)
    local t = two:gpu_tensor("f32", { 4 })
    two:call("kc_all_reduce", g, t, "sum"):get()
    -- The fake's all_reduce writes its communicator: two ranks in group order, the id made by the first member.
    local c = comm_of(t)
    assert.are.same({ 2, 0, two:procs()[1].pid, c[1][4] }, c[1])
    assert.are.same({ 2, 1, two:procs()[1].pid, c[1][4] }, c[2])
    two:call("kc_barrier", g):get()
    two:call("kc_all_reduce", g, t, "max"):get() -- the same communicator again
    assert.are.same(c, comm_of(t))
    -- A CPU tensor on the GPU group, and a GPU tensor on a CPU group, say what to do.
    local cpu = two:tensor("f32", { 4 })
    local ok, err = pcall(function() return two:call("kc_all_reduce", g, cpu, "sum"):get() end)
    assert.is_false(ok)
    assert.matches("is a GPU group %(mesh:group{ gpu = true }%); pass GPU tensors", tostring(err))
    g:free()
    local plain = two:group()
    ok, err = pcall(function() return two:call("kc_all_reduce", plain, t, "sum"):get() end)
    assert.is_false(ok)
    assert.matches("has no NCCL communicator; make the group with mesh:group{ gpu = true }", tostring(err))
    two:stop()
  end)

  it("fails a kernel's GPU all_reduce on every survivor at once when a member dies in it", function()
    need_fake()
    local three = hosts:spawn_procs{ procs = 3 }
    three:on_failure(function() end)
    three:load "kcoll"
    local g = three:group{ gpu = true }
    local t = three:gpu_tensor("f32", { 17 }) -- never completes on the fake, as when a peer died
    three:call("kc_barrier", g):get() -- the tensor exists everywhere before anyone dies
    hung_reset()
    local f = three:call("kc_all_reduce", g, t, "sum")
    hung_in(3) -- every member agreed on the call and waits on its stream
    os.execute("kill -9 " .. three:procs()[3].pid)
    local t0 = monarch.now()
    local ok, err = pcall(f.get, f)
    assert.is_false(ok)
    assert.is_true(monarch.now() - t0 < 10, "took " .. (monarch.now() - t0) .. " s")
    local msgs = { tostring(err) }
    for _, e in ipairs(err.failures or {}) do msgs[#msgs + 1] = tostring(e) end
    assert.matches("closed its link during all_reduce %(it failed or died%); communicator %d+ aborted",
      table.concat(msgs, "\n"))
    local survivors = three:slice{ procs = { 0, 2 } }
    for _, v in ipairs(survivors:gpu_info():get():values()) do assert.are.equal("Fake GPU", v.name) end
    g:free()
    three:stop()
  end)
end)
