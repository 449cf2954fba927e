-- Host-level self-healing (issue 15): a host lost for good is one event, the
-- mesh shrinks to the survivors, and examples/train.lua trains on without it.
-- Real host agents and procs; a host is lost by SIGKILL to its agent (its
-- procs die with it, PR_SET_PDEATHSIG).
local monarch = require "monarch"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local agent = require "support.agent"

local B = os.getenv("MONARCH_BUILD") or "build"
local alive = require("support.procstat").alive

local shell = require "support.shell"
local sh = shell.run

-- A fresh directory for a test's files, removed when the test ends.
local function scratch() return shell.scratch(finally) end

local background, wait_output, finished = shell.background, shell.wait_output, shell.finished

describe("a host lost for good", function()
  local daemons = {}

  before_each(function()
    monarch.hosts()
    for i = 1, 3 do daemons[i] = agent.start{ token = runtime.token } end
  end)

  after_each(function()
    for _, d in ipairs(daemons) do d:stop(9) end
    daemons = {}
  end)

  it("is one event naming the host and its procs, decided within a second; the survivors serve", function()
    local addrs = {}
    for i, d in ipairs(daemons) do addrs[i] = d.addr end
    local m = mesh_mod.host_mesh(mesh_mod.connect_agents(addrs)):spawn_procs{ procs = 2 }
    m:load "basic"
    local events = {}
    local off = monarch.on_host_loss(function(ev) events[#events + 1] = { ev = ev, at = monarch.now() } end)
    finally(function() -- busted keeps one finally per test: this one undoes all
      off()
      m:stop()
    end)
    local victim_pids = { m:procs()[3].pid, m:procs()[4].pid }
    local t0 = monarch.now()
    daemons[2]:stop(9)
    local f = m:call("sleep", 0.3)
    local ok, err = pcall(f.get, f, 10)
    assert.is_false(ok)
    assert.are.equal("proc_failed", err.kind)
    assert.matches("lost with its host " .. daemons[2].addr, err.message, 1, true)
    local deadline = monarch.now() + 5
    while #events == 0 and monarch.now() < deadline do monarch.sleep(0.02) end
    assert.are.equal(1, #events, "one event for the host")
    local ev = events[1].ev
    assert.are.equal("host_lost", ev.kind)
    assert.are.equal(daemons[2].addr, ev.addr)
    assert.are.same({ 2, 3 }, ev.ranks)
    assert.is_true(events[1].at - t0 < 1.0, "decided after " .. (events[1].at - t0) .. " s")
    for _, pid in ipairs(victim_pids) do assert.is_false(alive(pid)) end
    -- The survivors: same dimensions, two hosts; a collective over them forms a new group.
    local s, dropped = m:survivors()
    assert.are.equal(2, dropped)
    assert.are.same({ hosts = 2, procs = 2 }, s:sizes())
    assert.are.same({ 0, 1, 4, 5 }, s:rank())
    local t = s:tensor("f32", { 8 })
    s:call("fill", t, 1)
    s:all_reduce(t, "sum"):get(10)
    assert.are.same({ 32, 32, 32, 32 }, s:call("sum", t):get(10):values())
  end)

  it("stops a script that does not handle it with one line, no traceback", function()
    local addrs = {}
    for i, d in ipairs(daemons) do addrs[i] = d.addr end
    local code = string.format([[
      local m = require 'monarch'
      local p = m.hosts():spawn_procs{ procs = 1 }
      p:load 'basic'
      os.execute('kill -9 ' .. m.hosts().agents[3].pid)
      for i = 1, 200 do p:call('noop'):get() m.sleep(0.01) end
    ]])
    local out, rc = sh(("MONARCH_TOKEN=%s timeout 60 %s/bin/monarch-run --hosts %s -e \"%s\""):format(
      runtime.token, B, table.concat(addrs, ","), code))
    assert.are.equal(1, rc, out)
    assert.matches("host_lost", out)
    assert.matches("1 proc lost with it %(rank 2%)", out)
    assert.is_nil(out:find("stack traceback", 1, true), out)
  end)

  it("keeps the RL example rolling out on the other hosts, and on a host that joins, until it is solved", function()
    local dir = scratch()
    local out_path = dir .. "/out"
    background(("OPENBLAS_NUM_THREADS=1 MONARCH_TOKEN=%s timeout 120 %s/bin/monarch-run --hosts %s,%s "
      .. "--listen-joins 127.0.0.1:0 examples/rl/run.lua --procs 2 --kill-host-at 20 --wait-join-at 30 --max-seconds 60")
      :format(runtime.token, B, daemons[1].addr, daemons[2].addr), out_path)
    local addr = wait_output(out_path, "listening for joining hosts on ([%d.]+:%d+)", 30)
    assert.is_string(addr, "run.lua never opened its join port")
    local joiner = agent.start{ token = runtime.token, args = "--join " .. addr }
    finally(function() joiner:stop(9) end)
    local out, rc = finished(out_path, 90)
    assert.are.equal(0, rc, out)
    assert.matches("env host " .. daemons[2].addr .. " lost %(ranks 2,3%): rollouts go on on the other hosts", out)
    assert.matches("env host [%d.:]+ joined: 2 env procs added %(ranks 4,5%)", out)
    assert.matches("solved: mean return", out)
    local r4, r5 = out:match("rank 4: (%d+), rank 5: (%d+)")
    assert.is_true(tonumber(r4) > 0 and tonumber(r5) > 0, "the joined host's env procs rolled out nothing\n" .. out)
  end)

  it("lets examples/train.lua take in a host that joins mid-run: its procs get the state from a peer and step", function()
    local dir = scratch()
    local data_arg = require("support.digits").data_arg(dir)
    local out_path = dir .. "/out"
    -- train.lua waits at step 50 for a host to join (unless one has); the join port is any free one, printed.
    background(("OPENBLAS_NUM_THREADS=1 MONARCH_TOKEN=%s timeout 120 %s/bin/monarch-run --hosts %s,%s "
      .. "--listen-joins 127.0.0.1:0 examples/train.lua --device cpu --procs 2 --quiet --wait-join-at 50 "
      .. "--checkpoint-dir %s/ck%s"):format(runtime.token, B, daemons[1].addr, daemons[2].addr, dir, data_arg), out_path)
    local addr = wait_output(out_path, "listening for joining hosts on ([%d.]+:%d+)", 30)
    assert.is_string(addr, "train.lua never opened its join port")
    local joiner = agent.start{ token = runtime.token, args = "--join " .. addr }
    finally(function() joiner:stop(9) end)
    local out, rc = finished(out_path, 90)
    assert.are.equal(0, rc, out)
    assert.matches("1 host%(s%) joined with 2 procs; training goes on with 6 procs on 3 hosts from step %d+: "
      .. "global batch 128 %-> 192", out)
    assert.matches("elastic: stepping again [%d.]+ s after the host joined", out)
    assert.matches("weights identical on all 6 procs", out) -- the new procs stepped: they hold the same weights
    local acc = tonumber(out:match("test accuracy ([%d.]+)%%"))
    assert.is_true(acc and acc >= 95, "test accuracy " .. tostring(acc) .. "%\n" .. out)
  end)

  it("does not stop examples/train.lua: it trains on the survivors to the end", function()
    local addrs = {}
    for i, d in ipairs(daemons) do addrs[i] = d.addr end
    local dir = os.tmpname()
    os.remove(dir)
    local data_arg = require("support.digits").data_arg((os.execute("mkdir -p " .. dir) and dir))
    local out, rc = sh(("OPENBLAS_NUM_THREADS=1 MONARCH_TOKEN=%s timeout 120 %s/bin/monarch-run --hosts %s "
      .. "examples/train.lua --device cpu --procs 2 --quiet --kill-host-at 60 --checkpoint-dir %s/ck%s"):format(
      runtime.token, B, table.concat(addrs, ","), dir, data_arg))
    os.execute("rm -rf " .. dir)
    assert.are.equal(0, rc, out)
    assert.matches("host_lost", out)
    assert.matches("training goes on with 4 procs on 2 hosts from step 61: global batch 192 %-> 128", out)
    assert.matches("elastic: stepping again [%d.]+ s after the host was killed", out)
    assert.matches("weights identical on all 4 procs", out)
    local acc = tonumber(out:match("test accuracy ([%d.]+)%%"))
    assert.is_true(acc and acc >= 95, "test accuracy " .. tostring(acc) .. "%\n" .. out)
  end)
end)
