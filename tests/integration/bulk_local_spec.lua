-- Same-host bulk (monarch.bulk): put, scatter and fetch between the
-- controller and procs on its host, through the procs' own copies of our
-- memory where they can, over TCP where they cannot; the same specs pass
-- either way.
local ffi = require "ffi"
local monarch = require "monarch"
local bulk = require "monarch.bulk"
local core = require "monarch.core"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local tensor = require "monarch.tensor"
local agent = require "support.agent"

pcall(ffi.cdef, "int setenv(const char *, const char *, int); int unsetenv(const char *);")

local function fd_count()
  local p = io.popen("ls /proc/" .. tostring(select(1, core.bulk_self())) .. "/fd | wc -l")
  local n = tonumber(p:read("*a"))
  p:close()
  return n
end

-- This process's fds as "fd -> target" lines (the listing's own pipe included).
local function fd_targets()
  local p = io.popen("cd /proc/" .. tostring(select(1, core.bulk_self())) .. "/fd && for f in *; do " ..
    "echo \"$f -> $(readlink $f)\"; done")
  local set = {}
  for line in p:lines() do set[line] = true end
  p:close()
  return set
end

-- n pseudo-random bytes, the same for the same seed.
local function bytes(n, seed)
  local b = ffi.new("uint8_t[?]", math.max(n, 1))
  local x = seed
  for i = 0, n - 1 do
    x = (x * 1103515245 + 12345) % 2147483648
    b[i] = bit.band(bit.rshift(x, 16), 255)
  end
  return ffi.string(b, n)
end

local function stats() local s = {} for k, v in pairs(bulk.stats) do s[k] = v end return s end

-- The specs every path must pass. make() -> procs; expect: true (local) or false (TCP).
local function same_specs(name, make, expect, cleanup)
  describe(name, function()
    local procs
    setup(function()
      procs = make()
      procs:load "basic"
    end)
    teardown(function()
      if procs then procs:stop() end
      if cleanup then cleanup() end
    end)

    it("takes the path it should, and counts it", function()
      for _, p in ipairs(procs:proc_list()) do
        if expect and p.bulk ~= true and tostring(p.bulk_why):find("not permitted", 1, true) then
          print("skipped: the kernel forbids copying the controller's memory here: " .. p.bulk_why)
          return
        end
        assert.are.equal(expect, p.bulk, tostring(p.bulk_why))
      end
      local t = procs:tensor("f32", { 1000 })
      local before = stats()
      t:put(bytes(4000, 1)):get()
      t:fetch():get()
      local moved = expect and "local" or "tcp"
      assert.are.equal(before[moved .. "_puts"] + 1, bulk.stats[moved .. "_puts"])
      assert.are.equal(before[moved .. "_fetches"] + 1, bulk.stats[moved .. "_fetches"])
      assert.are.equal(before[moved .. "_bytes"] + 2 * 4000 * procs:size(), bulk.stats[moved .. "_bytes"])
      t:free()
    end)

    it("round-trips every dtype byte for byte, from strings and from HostTensors", function()
      local seed = 7
      for dtype, d in pairs(tensor.dtypes) do
        local n = 1031 -- not a multiple of a page or of a piece
        local t = procs:tensor(dtype, { n })
        local want = bytes(n * d.size, seed)
        seed = seed + 1
        t:put(want):get()
        for _, h in ipairs(t:fetch():get():values()) do assert.are.equal(want, h:bytes(), dtype) end
        local h = tensor.host(dtype, { n }, bytes(n * d.size, seed))
        t:put(h):get()
        for _, g in ipairs(t:fetch():get():values()) do assert.are.equal(h:bytes(), g:bytes(), dtype) end
        t:free()
      end
    end)

    it("moves tensors of several chunks, landing at their offsets, into reused memory", function()
      local old_local, old_tcp, old_min = bulk.CHUNK, tensor.CHUNK, bulk.SHARED_MIN
      bulk.CHUNK, tensor.CHUNK = 65536 + 12, 65536 + 12 -- odd sizes: every chunk at an odd offset
      bulk.SHARED_MIN = 65536 -- and the HostTensors shared, so chunks land at odd offsets of the proc's maps
      local ok, err = pcall(function()
        local n = 3 * 65536 + 777
        local t = procs:tensor("u8", { n })
        local want = bytes(n, 99)
        t:put(want):get()
        local into = t:fetch():get()
        for _, h in ipairs(into:values()) do assert.are.equal(want, h:bytes()) end
        local again = tensor.host("u8", { n }, bytes(n, 100))
        assert.is_not_nil(rawget(again, "_fd"))
        t:put(again):get()
        local same = t:fetch(into):get()
        for i, h in ipairs(same:values()) do
          assert.are.equal(into[i], h)
          assert.are.equal(again:bytes(), h:bytes())
        end
        t:free()
      end)
      bulk.CHUNK, tensor.CHUNK, bulk.SHARED_MIN = old_local, old_tcp, old_min
      assert(ok, err)
    end)

    it("scatters a different value to each proc", function()
      local t = procs:tensor("i64", { 64 })
      local vals = {}
      for i = 1, procs:size() do vals[i] = bytes(64 * 8, 200 + i) end
      t:scatter(vals):get()
      for i, h in ipairs(t:fetch():get():values()) do assert.are.equal(vals[i], h:bytes()) end
      t:free()
    end)

    it("holds nothing once every transfer is answered", function()
      local t = procs:tensor("u8", { 1048576 })
      local futs = {}
      for i = 1, 8 do futs[i] = t:put(bytes(1048576, i)) end
      for _, f in ipairs(futs) do f:get() end
      t:fetch():get()
      assert.are.equal(0, core.holds())
      t:free()
    end)
  end)
end

same_specs("same-host bulk on one host", function() return monarch.hosts():spawn_procs{ procs = 2 } end, true)

same_specs("same-host bulk switched off (MONARCH_BULK_LOCAL=0): TCP", function()
  ffi.C.setenv("MONARCH_BULK_LOCAL", "0", 1)
  return monarch.hosts():spawn_procs{ procs = 2 }
end, false, function() ffi.C.unsetenv("MONARCH_BULK_LOCAL") end)

local refusing
same_specs("same-host bulk refused by the procs (simulated EPERM): TCP", function()
  monarch.hosts()
  refusing = agent.start{ token = runtime.token, env = "MONARCH_BULK_LOCAL_SIMULATE=eperm" }
  return mesh_mod.host_mesh(mesh_mod.connect_agents{ refusing.addr }):spawn_procs{ procs = 2 }
end, false, function() refusing:stop() end)

-- The proc's own counters (__bulk_stats): maps held, bytes through maps, bytes by process_vm, maps made.
local function proc_stats(procs)
  local v = procs:call("__bulk_stats"):get():values()[1]
  return { held = v[1], mapped = v[2], vm = v[3], made = v[4], why = v[5] }
end

-- A field of /proc/<pid>/status, in kB.
local function status_kb(pid, field)
  local f = assert(io.open("/proc/" .. pid .. "/status"))
  local s = f:read("*a")
  f:close()
  return tonumber(s:match(field .. ":%s*(%d+)"))
end

describe("same-host bulk through shared HostTensors", function()
  local procs, local_ok
  setup(function()
    procs = monarch.hosts():spawn_procs{ procs = 1 }
    procs:load "basic"
    local p = procs:proc_list()[1]
    bulk.local_set(procs:proc_list())
    local_ok = p.bulk == true
    if not local_ok then print("skipped: no same-host copy here: " .. tostring(p.bulk_why)) end
  end)
  teardown(function() procs:stop() end)

  it("copies a big HostTensor through one map that the proc keeps, both ways", function()
    if not local_ok then return end
    local n = 40 * 1024 * 1024 + 777 -- two chunks, not a whole number of pages
    local t = procs:tensor("u8", { n })
    local h = tensor.host("u8", { n })
    assert.is_not_nil(rawget(h, "_fd"), "a HostTensor of SHARED_MIN bytes or more is shared")
    for i = 1, n, 4093 do h[i] = i % 253 end
    h[n] = 42
    local s0 = proc_stats(procs)
    t:put(h):get()
    t:put(h):get()
    local s1 = proc_stats(procs)
    assert.are.equal(s0.made + 1, s1.made, "the source is mapped once, for both puts")
    assert.are.equal(s0.mapped + 2 * n, s1.mapped)
    assert.are.equal(s0.vm, s1.vm)
    local into = t:fetch():get()
    assert.is_true(into[1]:bytes() == h:bytes(), "fetched bytes differ from what was put")
    local s2 = proc_stats(procs)
    assert.are.equal(s1.made + 1, s2.made)
    assert.are.equal(s1.mapped + n, s2.mapped)
    t:put(h:bytes()):get() -- a string is no HostTensor: the kernel copies it
    assert.are.equal(proc_stats(procs).vm, s2.vm + n)
    t:free()
  end)

  it("gives a collected HostTensor's memory back at once, and the proc drops its map when idle", function()
    if not local_ok then return end
    local n = 64 * 1024 * 1024
    local t = procs:tensor("u8", { n })
    local h = tensor.host("u8", { n })
    for i = 1, n, 4096 do h[i] = 1 end
    t:put(h):get()
    local pid = procs:proc_list()[1].pid
    assert.is_true(status_kb(pid, "RssShmem") >= n / 1024, "the proc maps the source")
    assert.is_true(proc_stats(procs).held >= 1)
    h = nil
    collectgarbage()
    collectgarbage()
    -- The pages are punched out of the file: gone from the proc too, though it still maps it.
    assert.is_true(status_kb(pid, "RssShmem") < n / 1024 / 2, "the proc still holds the collected HostTensor's pages")
    local t0, held = monarch.now(), nil
    repeat
      runtime.pump(0.3)
      held = proc_stats(procs).held
    until held == 0 or monarch.now() - t0 > 5
    assert.are.equal(0, held, "the proc kept a map of a HostTensor we collected")
    t:free()
  end)

  it("keeps HostTensors in plain memory under MONARCH_BULK_SHARED=0, and copies them all the same", function()
    ffi.C.setenv("MONARCH_BULK_SHARED", "0", 1)
    local ok, err = pcall(function()
      local n = bulk.SHARED_MIN
      local h = tensor.host("u8", { n }, bytes(n, 5))
      assert.is_nil(rawget(h, "_fd"))
      local t = procs:tensor("u8", { n })
      t:put(h):get()
      assert.is_true(t:fetch():get()[1]:bytes() == h:bytes())
      t:free()
    end)
    ffi.C.unsetenv("MONARCH_BULK_SHARED")
    assert(ok, err)
  end)
end)

describe("same-host bulk and a proc's failures", function()
  setup(function() monarch.configure{ heartbeat = 0.1, heartbeat_timeout = 1.0, reconnect = 2.0 } end)
  teardown(function() monarch.configure{ heartbeat = 0.5, heartbeat_timeout = 3.0, reconnect = 5.0 } end)

  it("refuses a range outside the tensor and an address that wraps, naming them", function()
    local procs = monarch.hosts():spawn_procs{ procs = 1 }
    local t = procs:tensor("u8", { 100 })
    local pid, caddr, cookie = core.bulk_self()
    local ok, err = pcall(function() return procs:call("__bulk_put", t, 90, 20, 4096, pid, caddr, cookie):get() end)
    assert.is_false(ok)
    assert.are.equal("bad_args", err.kind)
    assert.matches("range 90%+20 is outside the tensor's 100 bytes", err.message)
    ok, err = pcall(function() return procs:call("__bulk_fetch", t, 0, 10, 0, pid, caddr, cookie):get() end)
    assert.is_false(ok)
    assert.matches("__bulk_fetch takes", err.message)
    ok, err = pcall(function() return procs:call("__bulk_put", t, 0, 10, 4096, pid, caddr, cookie + 2):get() end)
    assert.is_false(ok)
    assert.matches("not the controller that asked", err.message)
    procs:stop()
  end)

  it("reports a proc killed mid-put as proc_failed, lives on and leaks nothing", function()
    local fds, before = fd_count(), fd_targets()
    local procs = monarch.hosts():spawn_procs{ procs = 1 }
    local victim = procs:procs()[1]
    local n = 256 * 1024 * 1024
    local t = procs:tensor("u8", { n })
    local src = tensor.host("u8", { n }, nil, true)
    local futs = {}
    for i = 1, 4 do futs[i] = t:put(src) end
    os.execute("kill -9 " .. victim.pid)
    local failed
    for _, f in ipairs(futs) do
      local ok, err = pcall(function() return f:get() end)
      if not ok then failed = err end
    end
    assert.is_not_nil(failed, "no put failed although its proc was killed")
    assert.are.equal("proc_failed", failed.kind)
    assert.are.equal(victim.pid, failed.pid)
    local t0 = monarch.now()
    while core.holds() > 0 and monarch.now() - t0 < 5 do runtime.pump(0.05) end
    assert.are.equal(0, core.holds(), "memory is still held for the dead proc")
    procs:stop()
    src, futs = nil, nil -- a shared HostTensor holds an fd of its own until it is collected
    collectgarbage()
    local other = monarch.hosts():spawn_procs{ procs = 1 }
    other:load "basic"
    assert.are.same({ 0, 1 }, other:call("rank"):get():values()[1])
    other:stop()
    t0 = monarch.now()
    -- A bounded poll: a loaded machine takes longer to see the procs exit, and a finalizer may need
    -- another cycle to close the HostTensor's memfd.
    while fd_count() > fds and monarch.now() - t0 < 15 do
      collectgarbage()
      runtime.pump(0.05)
    end
    -- No leak: at most the fds of the start (a link an earlier case left may have closed since).
    local now_fds = fd_count()
    if now_fds > fds then -- name what is new, for the one who reads the failure
      local new = {}
      for line in pairs(fd_targets()) do if not before[line] then new[#new + 1] = line end end
      table.sort(new)
      error(string.format("%d fds open, %d before; new: %s", now_fds, fds, table.concat(new, ", ")))
    end
  end)
end)
