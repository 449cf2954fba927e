-- The OpenBLAS core type a host agent gives its procs (host/agent/agent_blas.c, issue 34): the user's
-- OPENBLAS_CORETYPE kept, a pick that fails its self-check dropped, the choice shown by STATUS.
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

describe("a host agent's BLAS core type", function()
  local agent, procs

  setup(function()
    if not runtime.initialized then runtime.init("blas-spec") end -- our agents need no local one
  end)

  -- An agent started with env, one proc of it; returns the agent's STATUS blas field and the proc's environment.
  local function start(env)
    agent = require("support.agent").start{ token = runtime.token, env = env }
    procs = mesh_mod.host_mesh(mesh_mod.connect_agents{ agent.addr }):spawn_procs{ procs = 1 }
    local p = procs:proc_list()[1]
    local r = status.collect{ p.agent }[1]
    assert.is_true(r.ok, tostring(r.value))
    return r.value.blas, env_of(p.pid)
  end

  after_each(function()
    if procs then procs:stop() end
    if agent then agent:stop() end
    procs, agent = nil, nil
  end)

  it("is the user's OPENBLAS_CORETYPE where one is set", function()
    local blas, env = start("OPENBLAS_CORETYPE=HASWELL")
    assert.are.equal("user", blas.source)
    assert.are.equal("haswell", blas.core:lower())
    assert.is_true(blas.gflops > 0)
    assert.matches("OPENBLAS_CORETYPE=HASWELL%z", env)
  end)

  it("drops a core type that fails its self-check, says so once, and leaves the procs OpenBLAS's own", function()
    local blas, env = start("env -u OPENBLAS_CORETYPE MONARCH_BLAS_PROBE_CORRUPT=1 MONARCH_BLAS_CORETYPE=HASWELL")
    assert.are.equal("openblas", blas.source)
    assert.are.equal(blas.openblas, blas.core)
    assert.matches("HASWELL failed its self%-check", blas.note)
    assert.is_nil(env:find("OPENBLAS_CORETYPE=", 1, true))
    local _, said = agent:output():gsub("failed its self%-check", "")
    assert.are.equal(1, said)
  end)

  it("runs AVX-512 kernels on a CPU with AVX-512, and nothing OpenBLAS does not already run elsewhere", function()
    local blas, env = start("env -u OPENBLAS_CORETYPE MONARCH_BLAS_CORETYPE=auto")
    assert.is_true(blas.ok)
    if cpu_has("avx512f") and cpu_has("avx512bw") and cpu_has("avx512vl") and cpu_has("avx512dq") then
      -- An AVX-512 kernel: SKYLAKEX, or one OpenBLAS recognised itself and that SKYLAKEX did not beat by 10%.
      local avx512 = { skylakex = true, cooperlake = true, sapphirerapids = true }
      assert.is_true(avx512[blas.core:lower()] ~= nil, "procs run " .. blas.core .. " on an AVX-512 CPU")
      if blas.source == "auto" then assert.matches("OPENBLAS_CORETYPE=SKYLAKEX%z", env) end
    else
      assert.are_not.equal("skylakex", blas.core:lower())
      assert.is_nil(env:find("OPENBLAS_CORETYPE=SKYLAKEX", 1, true))
    end
  end)

  it("is left to OpenBLAS with MONARCH_BLAS_CORETYPE=off, and monarch-run --status says why", function()
    agent = require("support.agent").start{ token = runtime.token,
      env = "env -u OPENBLAS_CORETYPE MONARCH_BLAS_CORETYPE=off" }
    local f = io.popen(("MONARCH_TOKEN='%s' %s/bin/monarch-run --hosts %s --status 2>&1"):format(runtime.token, B,
      agent.addr))
    local out = f:read("*a")
    f:close()
    assert.matches("blas %S+ %(off%) [%d.]+ GFLOP/s", out)
    assert.matches("procs run OpenBLAS's own %S+: MONARCH_BLAS_CORETYPE=off", out)
  end)
end)
