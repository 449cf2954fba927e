-- The OpenBLAS core type a host agent gives its procs and monarch-run takes itself (host/agent/agent_blas.c,
-- host/core/blas_choose.c, issue 34): measured at our kernels' shapes, the user's OPENBLAS_CORETYPE kept, a
-- core type that fails its self-check dropped, the answer cached, the choice shown by STATUS and --status.
-- Assertions are on choices and fields, never on timings.
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local status = require "monarch.status"

local B = os.getenv("MONARCH_BUILD") or "build"

local env_of = require("support.procstat").environ

local function cpu_has(flag)
  local f = io.open("/proc/cpuinfo", "r")
  local s = f and f:read("*a") or ""
  if f then f:close() end
  return s:match("\nflags%s*:[^\n]*") ~= nil and (s:match("\nflags%s*:([^\n]*)") .. " "):find(" " .. flag .. " ", 1, true) ~= nil
end

local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1")
  local out = f:read("*a")
  f:close()
  return out
end

describe("a host agent's BLAS core type", function()
  local agent, procs, cache

  setup(function()
    if not runtime.initialized then runtime.init("blas-spec") end -- our agents need no local one
    cache = os.tmpname()
    os.remove(cache)
  end)

  teardown(function() os.execute("rm -rf '" .. cache .. "'") end)

  -- An agent started with env (and this spec's own cache directory), one proc of it; returns the agent's
  -- STATUS blas field and the proc's environment.
  local function start(env)
    agent = require("support.agent").start{ token = runtime.token, env = "XDG_CACHE_HOME=" .. cache .. " " .. env }
    procs = mesh_mod.host_mesh(mesh_mod.connect_agents{ agent.addr }):spawn_procs{ procs = 1 }
    local p = procs:proc_list()[1]
    local r = status.collect{ p.agent }[1]
    assert.is_true(r.ok, tostring(r.value))
    return r.value.blas, env_of(p.pid)
  end

  local function stop()
    if procs then procs:stop() end
    if agent then agent:stop() end
    procs, agent = nil, nil
  end

  after_each(stop)

  it("is the user's OPENBLAS_CORETYPE where one is set", function()
    local blas, env = start("OPENBLAS_CORETYPE=HASWELL")
    assert.are.equal("user", blas.source)
    assert.are.equal("haswell", blas.core:lower())
    assert.is_true(blas.gflops > 0)
    assert.matches("OPENBLAS_CORETYPE=HASWELL%z", env)
  end)

  it("drops a named core type that fails its self-check, says so once, and leaves the procs OpenBLAS's own", function()
    local blas, env = start("env -u OPENBLAS_CORETYPE MONARCH_BLAS_PROBE_CORRUPT=1 MONARCH_BLAS_CORETYPE=HASWELL")
    assert.are.equal("openblas", blas.source)
    assert.are.equal(blas.openblas, blas.core)
    assert.matches("HASWELL failed its self%-check", blas.note)
    assert.is_nil(env:find("OPENBLAS_CORETYPE=", 1, true))
    local _, said = agent:output():gsub("failed its self%-check", "")
    assert.are.equal(1, said)
  end)

  it("drops every candidate that fails its self-check, and caches nothing the test hook made", function()
    local blas, env = start("env -u OPENBLAS_CORETYPE MONARCH_BLAS_PROBE_CORRUPT=1")
    assert.are.equal("openblas", blas.source)
    assert.are.equal(blas.openblas, blas.core)
    assert.is_nil(env:find("OPENBLAS_CORETYPE=", 1, true))
    assert.is_false(blas.cached)
    for i, t in ipairs(blas.tried) do
      if i == 1 then assert.is_true(t.ok) else assert.is_false(t.ok, t.name) end
    end
    if #blas.tried > 1 then assert.matches("failed its self%-check", blas.note) end
    -- Only BLAS's own entries: the agent's library cache (monarch/ship) lives beside them.
    assert.are.equal("", sh("ls " .. cache .. "/monarch/ 2>/dev/null | grep '^blas-' | grep -v '\\.lock$'"))
  end)

  it("runs the fastest core type that passes, measured at our kernels' shapes, and caches the answer", function()
    local blas, env = start("env -u OPENBLAS_CORETYPE MONARCH_BLAS_CORETYPE=auto")
    assert.is_true(blas.ok)
    assert.is_false(blas.cached)
    assert.are.equal("", blas.tried[1].name) -- OpenBLAS's own choice first
    assert.is_true(blas.tried[1].ok)
    local best = 1
    for i, t in ipairs(blas.tried) do
      if i > 1 and t.ok and (best == 1 or t.gflops > blas.tried[best].gflops) then best = i end
    end
    if blas.source == "auto" then
      assert.are.equal(blas.tried[best].core, blas.core)
      assert.matches("OPENBLAS_CORETYPE=" .. blas.tried[best].name .. "%z", env)
      assert.matches("MONARCH_BLAS_PICKED=" .. blas.tried[best].name .. "%z", env)
    else
      assert.are.equal("openblas", blas.source)
      assert.are.equal(blas.openblas, blas.core)
      assert.is_nil(env:find("OPENBLAS_CORETYPE=", 1, true))
      assert.is_string(blas.note)
    end
    if cpu_has("avx512f") and cpu_has("avx512bw") and cpu_has("avx512vl") and cpu_has("avx512dq") then
      local tried = {}
      for _, t in ipairs(blas.tried) do tried[t.name] = true end
      assert.is_true(tried.SKYLAKEX or blas.openblas:lower() == "skylakex")
    else
      for _, t in ipairs(blas.tried) do assert.are_not.equal("SKYLAKEX", t.name) end
    end
    -- The next agent reads the answer instead of probing.
    local core, source = blas.core, blas.source
    stop()
    blas = start("env -u OPENBLAS_CORETYPE")
    assert.is_true(blas.cached)
    assert.are.equal(core, blas.core)
    assert.are.equal(source, blas.source)
  end)

  it("is left to OpenBLAS with MONARCH_BLAS_CORETYPE=off, and monarch-run --status says why and what was measured",
    function()
      agent = require("support.agent").start{ token = runtime.token,
        env = "env -u OPENBLAS_CORETYPE XDG_CACHE_HOME=" .. cache .. " MONARCH_BLAS_CORETYPE=off" }
      local out = sh(("MONARCH_TOKEN='%s' %s/bin/monarch-run --hosts %s --status"):format(runtime.token, B, agent.addr))
      assert.matches("blas %S+ %(off[^)]*%) [%d.]+ GFLOP/s", out)
      -- OpenBLAS's own choice reads as generic kernels where it does not know the CPU (it falls back to Prescott).
      local own = out:match("procs run OpenBLAS's own %S+: MONARCH_BLAS_CORETYPE=off") or
        out:match("procs run generic kernels %(Prescott, OpenBLAS's fallback[^)]*%): MONARCH_BLAS_CORETYPE=off")
      assert(own, "no line says OpenBLAS's own choice is used for MONARCH_BLAS_CORETYPE=off:\n" .. out)
      assert.matches("measured %(OpenBLAS [%d.]+, one core, GFLOP/s at our kernels' shapes%): own %S+ [%d.]+", out)
    end)

  it("says in --status when procs run generic kernels, and why", function()
    agent = require("support.agent").start{ token = runtime.token,
      env = "XDG_CACHE_HOME=" .. cache .. " OPENBLAS_CORETYPE=PRESCOTT" }
    local out = sh(("MONARCH_TOKEN='%s' %s/bin/monarch-run --hosts %s --status"):format(runtime.token, B, agent.addr))
    assert.matches("procs run generic kernels %(Prescott, OpenBLAS's fallback[^)]*%): the user's OPENBLAS_CORETYPE=PRESCOTT",
      out)
  end)
end)

describe("monarch-run's own BLAS core type", function()
  local cache

  setup(function()
    cache = os.tmpname()
    os.remove(cache)
  end)

  teardown(function() os.execute("rm -rf '" .. cache .. "'") end)

  local function coretype(env)
    return sh(("env XDG_CACHE_HOME=%s %s %s/bin/monarch-run -e 'print(os.getenv(\"OPENBLAS_CORETYPE\"), "
      .. "os.getenv(\"MONARCH_BLAS_PICKED\"))'"):format(cache, env, B)):match("([^\n]*)\n$")
  end

  it("is the same choice an agent makes, marked as ours", function()
    local first = coretype("env -u OPENBLAS_CORETYPE")
    local a, b = first:match("^(%S+)\t(%S+)$")
    assert.are.equal(a, b) -- nil nil where OpenBLAS's own choice stands, else the core type twice
    assert.are.equal(first, coretype("env -u OPENBLAS_CORETYPE")) -- the second from the cache
  end)

  it("keeps the user's OPENBLAS_CORETYPE, and sets none with MONARCH_BLAS_CORETYPE=off", function()
    assert.are.equal("ZEN\tnil", coretype("OPENBLAS_CORETYPE=ZEN"))
    assert.are.equal("nil\tnil", coretype("env -u OPENBLAS_CORETYPE MONARCH_BLAS_CORETYPE=off"))
  end)
end)
