-- The Slurm launcher (monarch.launch): what it reads from Slurm's output,
-- always; and a real job on a private single-node Slurm started by
-- tests/slurm/setup.sh (needs root, slurmd, slurmctld and munge; skipped
-- with the reason otherwise). The job runs monarch-run with
-- MONARCH_LAUNCHER=slurm through `sbatch --wait`, bounded by JOB_TIMEOUT.
-- The Slurm is stopped at the end unless another test run still uses it
-- (MONARCH_SLURM_KEEP=1 leaves it running, logs in /tmp/monarch-slurm/log).
local launch = require "monarch.launch"

local B = os.getenv("MONARCH_BUILD") or "build"
local SLURM_DIR = "/tmp/monarch-slurm" -- setup.sh's default: a Slurm already running there is shared
local SETUP_TIMEOUT = 120 -- seconds for setup.sh: another run's setup or stop, then the node coming up
local JOB_TIMEOUT = 90   -- seconds for the whole test job, queueing included

local shell = require "support.shell"
local sh = shell.run

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local function write_file(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

describe("the Slurm launcher", function()
  it("reads each task's node, step and agent port from srun's labelled output", function()
    local tasks, ready = launch.parse_agent_output(table.concat({
      "1: monarch-slurm: node n2 step 77.0",
      "0: monarch-slurm: node n1 step 77.0",
      "0: monarch-worker: host agent listening on 0.0.0.0:41000",
      "1: some proc output",
      "1: monarch-worker: host agent listening on 0.0.0.0:41001",
      "0: monarch-worker: host agent listening on 0.0.0.0:49999", -- a repeat does not count twice
    }, "\n"))
    assert.are.equal(2, ready)
    assert.are.same({ node = "n1", step = "77.0", host = "0.0.0.0", port = 41000 }, tasks[0])
    assert.are.same({ node = "n2", step = "77.0", host = "0.0.0.0", port = 41001 }, tasks[1])
  end)

  it("reads the labels srun pads for ten or more tasks", function()
    local tasks, ready = launch.parse_agent_output(" 3: monarch-worker: host agent listening on [::]:7000\n")
    assert.are.equal(1, ready)
    assert.are.equal(7000, tasks[3].port)
    assert.are.equal("::", tasks[3].host)
  end)

  it("does not count a task that has not printed its port yet", function()
    local _, ready = launch.parse_agent_output("0: monarch-slurm: node n1 step 5.0\n0: monarch-wor")
    assert.are.equal(0, ready)
  end)

  it("reads NodeAddr from scontrol show node, falling back to the node name", function()
    local addrs = launch.parse_node_addrs(
      "NodeName=n1 Arch=x86_64 NodeAddr=10.0.0.1 NodeHostName=n1 Version=22.05\n" ..
      "NodeName=n2 Arch=x86_64 NodeAddr=(null) State=IDLE\n")
    assert.are.same({ n1 = "10.0.0.1", n2 = "n2" }, addrs)
  end)

  it("orders the agents by Slurm's node order, not by task number", function()
    local tasks = {
      [0] = { node = "n2", port = 2 },
      [1] = { node = "n1", port = 1 },
      [2] = { node = "n3", port = 3 },
    }
    assert.are.same({ "10.0.0.1:1", "n2:2", "[fe80::3]:3" },
      launch.agent_addresses(tasks, { "n1", "n2", "n3" }, { n1 = "10.0.0.1", n3 = "fe80::3" }))
  end)

  it("refuses to start outside an allocation, naming what is missing", function()
    local ok, err = pcall(launch.slurm, { token = "t", worker = "w", getenv = function() return nil end })
    assert.is_false(ok)
    assert.matches("not inside a Slurm allocation %(SLURM_JOB_ID is not set%)", err)
  end)

  it("refuses an agent port that is not a port number", function()
    local env = { SLURM_JOB_ID = "1", SLURM_JOB_NODELIST = "x", MONARCH_SLURM_PORT = "70000" }
    local ok, err = pcall(launch.slurm, { token = "t", worker = "w", getenv = function(k) return env[k] end })
    assert.is_false(ok)
    assert.matches("MONARCH_SLURM_PORT '70000' is not a port number", err)
  end)

  it("rejects an unknown launcher by name", function()
    local ok, err = pcall(launch.start, "pbs", {})
    assert.is_false(ok)
    assert.matches("unknown launcher 'pbs'", err)
  end)
end)

-- ---- a real Slurm ----------------------------------------------------------------------

local function slurm_here()
  local uid = sh("id -u")
  if not uid:match("^0%s*$") then return nil, "not root (the private Slurm's slurmd must run as root)" end
  for _, c in ipairs { "sbatch", "slurmctld", "slurmd", "munged" } do
    local _, rc = sh("command -v " .. c)
    if rc ~= 0 then return nil, c .. " is not installed (apt-get install slurmd slurmctld slurm-client munge)" end
  end
  -- $PPID in popen's shell is this process: the owner setup.sh records.
  local out, rc = sh(string.format('MONARCH_SLURM_DIR=%s timeout %d tests/slurm/setup.sh "$PPID"',
    SLURM_DIR, SETUP_TIMEOUT))
  if rc ~= 0 then return nil, "tests/slurm/setup.sh failed (rc " .. tostring(rc) .. "): " .. out end
  return true
end

local started, why = slurm_here()
if not started then
  describe("a Slurm job running monarch-run", function()
    pending("skipped: " .. why)
  end)
  print("slurm_spec: skipped: " .. why)
  return
end

local CONF = "SLURM_CONF=" .. SLURM_DIR .. "/slurm.conf "

-- The job: hello.lua, the cluster example, a check that the token is on no
-- command line, an agent that cannot start, one that never reports its port,
-- and agents that do not leave on the goodbye (the launcher must cancel
-- their step). "== name" markers separate them.
local JOB = [[#!/bin/sh
export TMPDIR="$SPEC_DIR/tmp"
mkdir -p "$TMPDIR"
RUN=$MONARCH_BUILD/bin/monarch-run
echo "== hello"
MONARCH_LAUNCHER=slurm $RUN examples/hello.lua
echo "== hello exit $?"
echo "== cluster"
MONARCH_LAUNCHER=slurm $RUN examples/slurm/cluster.lua 2
echo "== cluster exit $?"
echo "== token"
MONARCH_LAUNCHER=slurm $RUN "$SPEC_DIR/token.lua"
echo "== token exit $?"
echo "== bad worker"
MONARCH_WORKER=/nonexistent/monarch-worker MONARCH_LAUNCHER=slurm $RUN examples/hello.lua
echo "== bad worker exit $?"
echo "== silent agent"
MONARCH_SLURM_TIMEOUT=2 MONARCH_WORKER="$SPEC_DIR/silent-worker" MONARCH_LAUNCHER=slurm $RUN examples/hello.lua
echo "== silent agent exit $?"
echo "== no goodbye"
$RUN "$SPEC_DIR/stuck.lua"
echo "== no goodbye exit $?"
echo "== left in TMPDIR: $(ls "$TMPDIR" | wc -l)"
]]

-- An "agent" that starts but never reports a port.
local SILENT_WORKER = "#!/bin/sh\nexec sleep 60\n"

-- The token the controller generated must reach the agents but appear in no
-- process's arguments.
local TOKEN_SCRIPT = [[
local monarch = require "monarch"
local procs = monarch.hosts():spawn_procs { procs = 2 }
procs:load "basic"
local tok = monarch.runtime.token
local f = io.popen("ps -eo args")
local ps = f:read("*a")
f:close()
print("procs answered:", #procs:call("rank"):get():values())
print("token length:", #tok)
print("token on a command line:", ps:find(tok, 1, true) ~= nil)
]]

-- Agents started but never connected: --once cannot end them, so
-- launch.stop must cancel the step.
local STUCK_SCRIPT = [[
local launch = require "monarch.launch"
local core = require "monarch.core"
launch.STOP_GRACE = 1
local t0 = core.now()
local addrs = launch.slurm { token = "stuck-token", worker = core.prefix() .. "/bin/monarch-worker" }
print("agents:", #addrs)
launch.stop()
print(string.format("stopped after %.1fs", core.now() - t0))
]]

local job -- {out, id, rc, submit, dir}: the one job, run by the first test that needs it

local function run_job()
  if job then return job end
  local dir = sh("mktemp -d /tmp/monarch-slurm-job.XXXXXX"):match("^%s*(.-)%s*$")
  write_file(dir .. "/job.sh", JOB)
  write_file(dir .. "/token.lua", TOKEN_SCRIPT)
  write_file(dir .. "/stuck.lua", STUCK_SCRIPT)
  write_file(dir .. "/silent-worker", SILENT_WORKER)
  sh("chmod +x " .. dir .. "/silent-worker")
  local cwd = sh("pwd"):match("^%s*(.-)%s*$")
  local submit, rc = sh(string.format(
    "cd %s && SPEC_DIR=%s MONARCH_BUILD=%s %s timeout %d sbatch --wait --parsable --time=2 " ..
    "--job-name=monarch-spec --chdir=%s --output=%s/job.out %s/job.sh",
    cwd, dir, B, CONF, JOB_TIMEOUT, cwd, dir, dir))
  job = { out = read_file(dir .. "/job.out") or "", id = submit:match("(%d+)"), rc = rc, submit = submit, dir = dir }
  return job
end

-- The output between "== name" and "== name exit N", and N.
local function section(name)
  local j = run_job()
  local q = name:gsub("%p", "%%%0")
  local s = j.out:match("== " .. q .. "\n(.-)\n== " .. q .. " exit")
  if not s then error("section '" .. name .. "' missing from the job output:\n" .. j.out .. "\n" .. j.submit, 2) end
  return s, tonumber(j.out:match("== " .. q .. " exit (%d+)"))
end

-- Pids of processes whose environment says they belong to Slurm job `id`.
local function job_processes(id)
  local pids = {}
  for pid in sh("ls /proc"):gmatch("%d+") do
    local env = read_file("/proc/" .. pid .. "/environ") or ""
    if env:find("SLURM_JOB_ID=" .. id .. "\0", 1, true) then
      pids[#pids + 1] = pid .. " " .. (read_file("/proc/" .. pid .. "/cmdline") or ""):gsub("%z", " ")
    end
  end
  return pids
end

describe("a Slurm job running monarch-run with MONARCH_LAUNCHER=slurm", function()
  teardown(function()
    if job and job.dir then sh("rm -rf " .. job.dir) end
    -- Stops the Slurm unless another run still uses it.
    if not os.getenv("MONARCH_SLURM_KEEP") then sh("MONARCH_SLURM_DIR=" .. SLURM_DIR .. ' tests/slurm/stop.sh "$PPID"') end
  end)

  it("completes under sbatch --wait", function()
    local j = run_job()
    assert.are.equal(0, j.rc, j.submit .. "\n" .. j.out)
    assert.is_not_nil(j.id)
  end)

  it("runs hello.lua on procs of an agent that srun started on the node", function()
    local out, rc = section("hello")
    assert.are.equal(0, rc, out)
    assert.matches("0: monarch%-slurm: node %S+ step " .. run_job().id .. "%.%d+", out)
    assert.matches("0: monarch%-worker: host agent listening on 0%.0%.0%.0:%d+", out)
    for r = 0, 3 do
      assert.matches("%[hosts=0,procs=" .. r .. "%] {" .. r .. ", 4}", out)
      assert.matches("proc " .. r .. ": sum = 1024", out)
    end
    assert.matches("echo from procs=2:%s+hello", out)
  end)

  it("runs the cluster example's all-reduce across the job's procs", function()
    local out, rc = section("cluster")
    assert.are.equal(0, rc, out)
    assert.matches("HostMesh{hosts=1}", out)
    assert.matches("all_reduce over 2 procs on 1 hosts: ok", out)
  end)

  it("hands the agents a generated token without putting it on any command line", function()
    local out, rc = section("token")
    assert.are.equal(0, rc, out)
    assert.matches("procs answered:%s+2", out)
    assert.matches("token length:%s+48", out)
    assert.matches("token on a command line:%s+false", out)
  end)

  it("fails clearly when the agents cannot start", function()
    local out, rc = section("bad worker")
    assert.are.equal(1, rc, out)
    assert.matches("srun ended %(status %d+%) after 0 of 1 host agents started", out)
  end)

  it("gives up on agents that do not report a port within MONARCH_SLURM_TIMEOUT, and cancels them", function()
    local out, rc = section("silent agent")
    assert.are.equal(1, rc, out)
    assert.matches("only 0 of 1 host agents reported their port within 2s %(MONARCH_SLURM_TIMEOUT%)", out)
    assert.matches("STEP %d+%.%d+ ON %S+ CANCELLED", out)
  end)

  it("cancels the agents' step when they do not leave on the goodbye", function()
    local out, rc = section("no goodbye")
    assert.are.equal(0, rc, out)
    assert.matches("agents:%s+1", out)
    assert.matches("did not end after the goodbye; cancelling it", out)
    local secs = tonumber(out:match("stopped after ([%d.]+)s"))
    assert.is_truthy(secs and secs < launch.CANCEL_GRACE + 5, out)
  end)

  it("keeps monarch-run --slurm -i's hosts through two quick Ctrl-Cs: srun, in a session of its own, hears neither",
    function()
      local pty = require "support.pty"
      local salloc = sh("command -v salloc"):match("%S+")
      -- Two Ctrl-Cs within a second make an srun that hears them abort its step: every host lost.
      local t = pty.spawn({ salloc, "-N1", "--time=2", "--job-name=monarch-spec-ctrlc", B .. "/bin/monarch-run",
        "--slurm", "-i" }, { SLURM_CONF = SLURM_DIR .. "/slurm.conf", OPENBLAS_NUM_THREADS = "1", TERM = "xterm" })
      finally(function() t:close() end)
      t:expect("monarch> ", 60)
      t:ready()
      t:send("procs = hosts:spawn_procs{procs = 1}; procs:load 'basic'\n")
      t:expect("monarch> ", 30)
      t:ready()
      t:send("procs:call('sleep', 30):get()\n")
      t:pump(1)
      t:send("\3")
      t:pump(0.2)
      t:send("\3")
      t:expect("interrupted", 5)
      t:pump(2)
      t:ready()
      t:send("print('after' .. 'ctrl-c', #procs:call('rank'):get():values())\n")
      t:expect("afterctrl-c\t1\n", 30)
      local all = pty.plain(t.out)
      assert.not_matches("srun: interrupt", all, 1, true)
      assert.not_matches("host_lost", all, 1, true)
      t:ready()
      t:send("\4")
      assert.are.equal(0, t:wait(30), pty.plain(t.out))
    end)

  it("removes its private directories", function()
    local j = run_job()
    assert.matches("== left in TMPDIR: 0\n", j.out)
  end)

  it("leaves no process of the job running, agents and procs included", function()
    local j = run_job()
    local left = job_processes(j.id)
    for _ = 1, 50 do -- slurmd may still be reaping the batch step
      if #left == 0 then break end
      sh("sleep 0.1")
      left = job_processes(j.id)
    end
    assert.are.same({}, left)
    local q = sh(CONF .. "squeue -h -s -j " .. j.id)
    assert.is_falsy(q:find(j.id .. ".", 1, true), q) -- no step of the job is left
  end)
end)
