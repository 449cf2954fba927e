-- monarch.train (training as a library) as a user runs it: real monarch-run
-- controllers, real host agents, real procs. A toy step (tests/support/
-- toy_train.lua) for the library's own behaviours, and examples/train.lua for
-- the controller's death: killed with SIGKILL at a random step (or with a
-- collective in flight, or while the procs write a checkpoint), the same
-- command run again takes the job over from the procs and ends with the
-- weights of a run that was never interrupted, bit for bit.
local agent = require "support.agent"
local shell = require "support.shell"
local wait_for = require("support.wait").wait_for

local B = os.getenv("MONARCH_BUILD") or "build"
local sh, read, exists = shell.run, shell.read, shell.exists
local TOKEN = "train-lib-spec-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e9))

local function scratch() return shell.scratch(finally) end

local function toy(args, hosts)
  local h = hosts and (" --hosts " .. hosts) or ""
  return sh(("OPENBLAS_NUM_THREADS=1 MONARCH_TOKEN=%s timeout 90 %s/bin/monarch-run%s tests/support/toy_train.lua %s")
    :format(TOKEN, B, h, args))
end

local function crc_of(out) return out:match("crc32 (%x+)") end

describe("monarch.train with a toy step", function()

  it("parses its options and the script's, and names a wrong one in one line", function()
    local out, rc = toy("--help")
    assert.are.equal(0, rc, out)
    assert.matches("%-%-sharded", out)
    assert.matches("%-%-checkpoint%-dir", out)
    assert.matches("%-%-standby", out)
    out, rc = toy("--frobnicate")
    assert.are.equal(1, rc)
    assert.matches("toy_train.lua: unknown argument '%-%-frobnicate' %(%-%-help lists the options%)", out)
    out, rc = toy("--steps x")
    assert.are.equal(1, rc)
    assert.matches("%-%-steps wants an integer, got 'x'", out)
    out, rc = toy("--die-in nowhere")
    assert.are.equal(1, rc)
    assert.matches("%-%-die%-in must be step or checkpoint", out)
  end)

  it("recovers a killed proc from the procs' snapshot, bit for bit", function()
    local whole = toy("--steps 30 --every 0 --quiet")
    local out, rc = toy("--steps 30 --every 0 --quiet --snapshot-every 5 --kill-at 13")
    assert.are.equal(0, rc, out)
    assert.matches("restored the weights of step 10; replaying 3 step%(s%)", out)
    assert.matches("w sums 3720,3720,3720,3720", out)
    assert.are.equal(crc_of(whole), crc_of(out))
  end)

  it("resumes from its checkpoint shards, skipping a torn one and another job's, bit for bit", function()
    local dir = scratch()
    local whole = toy("--sharded --steps 40 --every 0 --quiet")
    local out, rc = toy("--sharded --steps 20 --every 10 --quiet --checkpoint-dir " .. dir)
    assert.are.equal(0, rc, out)
    assert.is_true(exists(dir .. "/ckpt-000000020.bin.shard-3"), "four shards (one per procs coordinate)")
    out, rc = toy("--sharded --job other --steps 30 --every 30 --quiet --checkpoint-dir " .. dir)
    assert.are.equal(0, rc, out)
    os.remove(dir .. "/ckpt-000000020.bin.shard-2")
    out, rc = toy("--sharded --steps 40 --every 0 --quiet --resume --checkpoint-dir " .. dir)
    assert.are.equal(0, rc, out)
    assert.matches("skipping .*ckpt%-000000030%.bin: written by job 'other', not 'toy'", out)
    assert.matches("skipping .*ckpt%-000000020%.bin%.shard%-2: No such file or directory %(the checkpoint is torn%)", out)
    assert.matches("resumed from .*ckpt%-000000010%.bin %(step 10%)", out)
    assert.are.equal(crc_of(whole), crc_of(out))
  end)
end)

describe("monarch.train.run from code (a REPL, a notebook)", function()
  it("takes its options as a list, raises what would end a script, and can run again in the same session", function()
    local dir = scratch()
    local script = dir .. "/api.lua"
    local f = assert(io.open(script, "w"))
    f:write([[
local train, errors = require "monarch.train", require "monarch.errors"
local progress = 0
local spec = {
  name = "api", figures = { { "loss", "%.4f" } },
  plan = function() return { steps_per_epoch = 5 } end,
  setup = function(job) return { state = { w = job.procs:tensor("f64", { 4 }) } } end,
  init = function(job) job.procs:call("fill", job.state.w, 0):get() end,
  step = function(job, s)
    job.procs:call("fill", job.state.w, s + 1):get()
    return { loss = 1 / (s + 1), samples = 1 }
  end,
  on_progress = function(job, s) progress = progress + 1 end,
}
local ok, err = pcall(train.run, spec, { [0] = "cell", "--bogus" })
print("bad option:", ok, errors.is(err) and err.kind, err.message or err)
local ok2, err2 = pcall(train.run, spec, "--steps 3")
print("bad args:", ok2, tostring(err2))
local dir = ...
for round = 1, 2 do
  local job = train.run(spec, { "--procs", "2", "--steps", "10", "--every", "5", "--quiet", "--checkpoint-dir", dir })
  print(("round %d: %d steps, %d progress calls, curve of %d steps"):format(round, job.total, progress,
    #job:plot_spec().x.values))
  progress = 0
end
print("after two runs: session goes on", require("monarch").hosts() ~= nil)
]])
    f:close()
    local out, rc = sh(("OPENBLAS_NUM_THREADS=1 timeout 90 %s/bin/monarch-run %s %s"):format(B, script, dir))
    assert.are.equal(0, rc, out)
    assert.matches("bad option:%s+false%s+train%s+cell: unknown argument '%-%-bogus'", out)
    assert.matches("bad args:%s+false%s+[^\n]*args wants a list of strings", out)
    assert.matches("round 1: 10 steps, 10 progress calls, curve of 10 steps", out)
    -- Again in the same session (a fresh start: no --resume): its own progress, its own curve.
    assert.matches("round 2: 10 steps, 10 progress calls, curve of 10 steps", out)
    assert.matches("after two runs: session goes on%s+true", out)
  end)
end)

describe("monarch.train on long-lived host agents", function()
  local daemons, addrs = agent.per_case(3, TOKEN)

  local function train(args)
    return sh(("OPENBLAS_NUM_THREADS=1 MONARCH_TOKEN=%s timeout 90 %s/bin/monarch-run --hosts %s examples/train.lua "
      .. "--device cpu --procs 2 %s"):format(TOKEN, B, addrs(), args))
  end

  it("shrinks on a lost host and grows on a joined one (toy step)", function()
    local out, rc = toy("--procs 2 --steps 30 --every 0 --quiet --kill-host-at 15", addrs())
    assert.are.equal(0, rc, out)
    -- From step 16, or a later one when steps were done before the agent's death was seen (a slow machine, ASan).
    local from = tonumber(out:match("training goes on with 4 procs on 2 hosts from step (%d+)"))
    assert.is_number(from, out)
    assert.is_true(from >= 16 and from <= 30, out)
    assert.matches("w sums 3720,3720,3720,3720", out)
    local o = scratch() .. "/out"
    local joiner
    shell.background(("OPENBLAS_NUM_THREADS=1 MONARCH_TOKEN=%s timeout 90 %s/bin/monarch-run --hosts %s "
      .. "--listen-joins 127.0.0.1:0 tests/support/toy_train.lua --procs 2 --steps 30 --every 0 --quiet "
      .. "--wait-join-at 10"):format(TOKEN, B, daemons[1].addr .. "," .. daemons[2].addr), o)
    local join_at = shell.wait_output(o, "listening for joining hosts on ([%d.]+:%d+)", 30)
    assert.is_string(join_at, "no join port")
    assert.is_string(shell.wait_output(o, "(waiting for a host to join)", 30), "never waited at step 10")
    joiner = agent.start{ token = TOKEN, args = "--join " .. join_at }
    finally(function() joiner:stop(9) end)
    out, rc = shell.finished(o, 60)
    assert.are.equal(0, rc, out)
    assert.matches("1 host%(s%) joined with 2 procs; training goes on with 6 procs on 3 hosts from step 11", out)
    assert.matches("w sums 3720,3720,3720,3720,3720,3720", out)
  end)

  it("survives a controller killed at a random step: the same command takes the job over, bit for bit", function()
    local dir = scratch()
    local args = "--steps 200 --every 0 --quiet --checkpoint-dir " .. dir
    local whole, rc0 = train(args .. " --job whole")
    assert.are.equal(0, rc0, whole)
    math.randomseed(os.time())
    local at = math.random(20, 180)
    local out, rc = train(args .. " --die-at " .. at)
    assert.are.equal(137, rc, "--die-at " .. at .. ": the controller should have been killed\n" .. out)
    out, rc = train(args)
    assert.are.equal(0, rc, out)
    assert.matches("controller: took over job 'train' %(6 procs on 3 hosts%) at step " .. at .. " from the procs' own "
      .. "state", out)
    assert.matches("no checkpoint read", out)
    assert.are.equal(crc_of(whole), crc_of(out))
    assert.are.equal("", (sh("ls " .. dir)), "no checkpoint on disk")
  end)

  it("survives a controller killed while the procs write a checkpoint", function()
    local dir = scratch()
    local args = "--steps 120 --every 40 --quiet --checkpoint-dir " .. dir
    local whole = train(args .. " --job whole")
    local out, rc = train(args .. " --die-at 80 --die-in checkpoint")
    assert.are.equal(137, rc, out)
    out, rc = train(args)
    assert.are.equal(0, rc, out)
    assert.matches("controller: took over job 'train'", out)
    assert.are.equal(crc_of(whole), crc_of(out))
    for _, s in ipairs { 40, 80, 120 } do
      local ck = require("monarch.checkpoint").read(("%s/ckpt-%09d.bin"):format(dir, s))
      assert.is_table(ck, "checkpoint of step " .. s .. " missing or invalid")
    end
  end)

  it("stops a frozen controller that wakes after a --standby took over; the standby ends bit for bit", function()
    -- Agents that drop a controller silent for 2 s (MONARCH_AGENT_SILENCE), so the standby takes over while the first
    -- one is stopped (SIGSTOP) with calls in flight; woken, it must not drive a proc again.
    for i = 1, 3 do
      daemons[i]:stop(9)
      daemons[i] = agent.start{ token = TOKEN, env = "MONARCH_AGENT_SILENCE=2" }
    end
    local dir = scratch()
    local args = "--steps 1500 --every 0 --quiet --checkpoint-dir " .. dir
    local whole = train(args .. " --job whole")
    local so, mo, pidfile = dir .. "/standby", dir .. "/main", dir .. "/main.pid"
    shell.background(("OPENBLAS_NUM_THREADS=1 MONARCH_TOKEN=%s timeout 120 %s/bin/monarch-run --hosts %s "
      .. "examples/train.lua --device cpu --procs 2 %s --standby"):format(TOKEN, B, addrs(), args), so)
    assert.is_string(shell.wait_output(so, "(standby: waiting)", 30))
    shell.background(("sh -c 'echo $$ > %s; exec env OPENBLAS_NUM_THREADS=1 MONARCH_TOKEN=%s %s/bin/monarch-run "
      .. "--hosts %s examples/train.lua --device cpu --procs 2 %s'"):format(pidfile, TOKEN, B, addrs(),
      args:gsub("%-%-quiet ", "")), mo) -- not quiet: the line below says it trains (quiet is not the job's identity)
    assert.is_string(shell.wait_output(mo, "(training on %d+ procs)", 30), read(mo))
    local pid = tonumber(read(pidfile):match("%d+"))
    math.randomseed(os.time())
    os.execute(("sleep %.2f; kill -STOP %d"):format(0.2 + math.random() * 0.8, pid))
    local took = shell.wait_output(so, "(controller: took over job 'train')", 30)
    os.execute("kill -CONT " .. pid)
    assert.is_string(took, "the standby never took over:\n" .. read(so))
    local out, rc = shell.finished(mo, 60)
    assert.are_not.equal(0, rc, out)
    assert.matches("job 'train' was taken over by another controller while this one was unreachable", out)
    out, rc = shell.finished(so, 90)
    assert.are.equal(0, rc, out)
    assert.are.equal(crc_of(whole), crc_of(out))
  end)

  it("lets a --standby controller take over, and refuses a second active one", function()
    local dir = scratch()
    local args = "--steps 300 --every 0 --quiet --checkpoint-dir " .. dir
    local whole = train(args .. " --job whole")
    local so = dir .. "/standby"
    shell.background(("OPENBLAS_NUM_THREADS=1 MONARCH_TOKEN=%s timeout 90 %s/bin/monarch-run --hosts %s "
      .. "examples/train.lua --device cpu --procs 2 %s --standby"):format(TOKEN, B, addrs(), args), so)
    assert.is_string(shell.wait_output(so, "(standby: waiting)", 30))
    -- A first controller that holds the job while a second one, not a standby, is refused.
    local mo = dir .. "/main"
    local pidfile = dir .. "/main.pid" -- its own pid, then exec: the kill below hits the controller itself
    shell.background(("sh -c 'echo $$ > %s; exec env OPENBLAS_NUM_THREADS=1 MONARCH_TOKEN=%s %s/bin/monarch-run "
      .. "--hosts %s --listen-joins 127.0.0.1:0 examples/train.lua --device cpu --procs 2 %s --wait-join-at 150'")
      :format(pidfile, TOKEN, B, addrs(), args), mo)
    assert.is_string(shell.wait_output(mo, "(waiting for a host to join)", 30))
    local out, rc = train(args)
    assert.are.equal(1, rc, out)
    assert.matches("job 'train' is driven by another controller, which is still connected to its hosts", out)
    local pid = read(pidfile):match("%d+")
    assert.is_true(require("support.procstat").alive(tonumber(pid)), "the first controller died:\n" .. read(mo))
    os.execute("kill -9 " .. pid)
    out, rc = shell.finished(so, 60)
    assert.are.equal(0, rc, out)
    assert.matches("controller: took over job 'train' %(6 procs on 3 hosts%) at step 150", out)
    assert.are.equal(crc_of(whole), crc_of(out))
  end)
end)
