--- monarch.launch: host agents started through a cluster manager.
-- monarch.hosts() calls M.start(name, opts) when monarch-run was given a
-- launcher (`--slurm`, or MONARCH_LAUNCHER=slurm); the launcher starts one
-- host agent per node and returns their addresses ({"host:port", ...}).
-- `--ray` (MONARCH_LAUNCHER=ray) is monarch.launch_ray: its agents join.
--
-- Slurm. Inside an allocation (sbatch or salloc: SLURM_JOB_ID is set) one
-- background job step runs an agent on every node of the job:
--
--   srun --nodes=N --ntasks=N --ntasks-per-node=1 --kill-on-bad-exit=1 --label \
--        --export=ALL --input=none --whole  sh -c 'echo node...; exec monarch-worker \
--        --listen 0.0.0.0:0 --once'
--
-- How an agent's address reaches us: every agent listens on a port the
-- kernel picks (no clash with anything else on the node, no port derived
-- from the job id that may already be taken) and prints it on stdout; srun
-- forwards task stdout to this node, labelled with the task number, and a
-- `tee` keeps a copy in a private directory here, where we read it. So no
-- shared file system and no fixed port are needed. The task first prints its
-- Slurm node name and step id; we connect to the node's NodeAddr (the address
-- slurmctld itself uses, from `scontrol show node`), falling back to the name.
--
-- The cluster token: MONARCH_TOKEN (or the file in MONARCH_TOKEN_FILE) if
-- set, else one the controller generated. It travels in the environment of
-- srun (--export=ALL), read by the background shell from a file in a 0700
-- directory (mktemp -d) and removed at once: never on any command line.
--
-- Teardown: the agents run with --once, so the goodbye monarch.shutdown()
-- sends ends them and with them the step. M.stop() (called after
-- monarch.shutdown) waits for srun to end, cancels the step if it does not
-- (scancel JOB.STEP, then SIGTERM and SIGKILL to srun) and removes the
-- directory.
local core = require "monarch.core"

local M = {}

M.START_TIMEOUT = 60  -- seconds for every agent of the job to report its port (MONARCH_SLURM_TIMEOUT)
M.STOP_GRACE = 10     -- seconds srun gets to end after the goodbye before its step is cancelled
M.CANCEL_GRACE = 5    -- seconds after scancel before srun is killed
local POLL = 0.05     -- seconds between looks at srun's output
local AGENT_STEP_NAME = "monarch-agents" -- srun --job-name of the agents' step
M.DEFAULT_SRUN_ARGS = "--whole" -- the agent's step gets every CPU and GPU of its node (MONARCH_SRUN_ARGS)

local current -- the running launch: {dir = its private directory, job = SLURM_JOB_ID}

-- ---- small helpers ---------------------------------------------------------------

local function shq(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- Runs cmd through the shell; returns its stdout and whether it exited 0.
local function capture(cmd)
  local f = io.popen(cmd .. "; echo \"::rc=$?\"")
  if not f then return "", false end
  local out = f:read("*a") or ""
  f:close()
  local rc = tonumber(out:match("::rc=(%d+)%s*$"))
  return (out:gsub("::rc=%d+%s*$", "")), rc == 0
end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local function write_file(path, s)
  local f, err = io.open(path, "wb")
  if not f then error("monarch slurm launcher: cannot write " .. path .. ": " .. tostring(err), 0) end
  f:write(s)
  f:close()
end

local function fail(msg) error("monarch slurm launcher: " .. msg, 0) end

local function words(s)
  local out = {}
  for w in (s or ""):gmatch("%S+") do out[#out + 1] = w end
  return out
end

-- ---- parsing what Slurm tells us (pure, tested without Slurm) ----------------------

--- The NodeAddr of every node in `scontrol show node -o` output: {name = addr}.
function M.parse_node_addrs(text)
  local addrs = {}
  for line in (text or ""):gmatch("[^\n]+") do
    local name = line:match("^NodeName=(%S+)")
    local addr = line:match("%sNodeAddr=(%S+)")
    if name then addrs[name] = (addr and addr ~= "(null)") and addr or name end
  end
  return addrs
end

--- What the agent tasks reported so far, from srun's labelled stdout:
-- {[task] = {node = name, step = "job.step", host = listen host, port = n}}
-- and how many tasks reported a port.
function M.parse_agent_output(text)
  local tasks, ready = {}, 0
  for line in (text or ""):gmatch("[^\n]+") do
    local task, rest = line:match("^%s*(%d+):%s?(.*)$")
    if task then
      task = tonumber(task)
      local t = tasks[task] or {}
      tasks[task] = t
      local node, step = rest:match("^monarch%-slurm: node (%S+) step (%S+)")
      if node then t.node, t.step = node, step end
      local host, port = rest:match("^monarch%-worker: host agent listening on %[?([^%]%s]+)%]?:(%d+)")
      if port and not t.port then
        t.host, t.port = host, tonumber(port)
        ready = ready + 1
      end
    end
  end
  return tasks, ready
end

--- Agent addresses ({"host:port", ...}) in the order of nodes (Slurm's node
-- order), from the tasks' reports and the NodeAddr map; a node that is not in
-- the map is reached by its name.
function M.agent_addresses(tasks, nodes, node_addrs)
  local order = {}
  for i, n in ipairs(nodes) do order[n] = i end
  local list = {}
  for task, t in pairs(tasks) do
    if t.port then list[#list + 1] = { task = task, t = t } end
  end
  table.sort(list, function(a, b)
    local oa, ob = order[a.t.node] or math.huge, order[b.t.node] or math.huge
    if oa ~= ob then return oa < ob end
    return a.task < b.task
  end)
  local out = {}
  for i, e in ipairs(list) do
    local host = e.t.node and (node_addrs[e.t.node] or e.t.node) or e.t.host
    if host:find(":", 1, true) then host = "[" .. host .. "]" end -- IPv6
    out[i] = host .. ":" .. e.t.port
  end
  return out
end

-- ---- Slurm ---------------------------------------------------------------------------

-- The background script: reads the token, starts the agents' step, records
-- srun's pid and exit status. Its stdout is monarch-run's.
local function launch_script(dir, n, srun_extra, worker, listen)
  local srun = {
    "srun", "--export=ALL", "--job-name=" .. AGENT_STEP_NAME, "--nodes=" .. n, "--ntasks=" .. n,
    "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--label", "--input=none",
  }
  for _, a in ipairs(srun_extra) do srun[#srun + 1] = shq(a) end
  local task = 'echo "monarch-slurm: node $SLURMD_NODENAME step $SLURM_JOB_ID.$SLURM_STEP_ID"; exec "$@"'
  local cmd = table.concat(srun, " ") .. " /bin/sh -c " .. shq(task) .. " monarch-agent " .. shq(worker)
    .. " --listen " .. shq(listen) .. " --once"
  return table.concat({
    "# Written by monarch.launch: the host agents of this Slurm job, in the background.",
    "D=" .. shq(dir),
    'MONARCH_TOKEN=$(cat "$D/token") || exit 1',
    'rm -f "$D/token"',
    "export MONARCH_TOKEN",
    "unset MONARCH_TOKEN_FILE",
    "{",
    "  " .. cmd .. " </dev/null &",
    '  echo $! >"$D/srun.pid"',
    "  wait $!",
    '  echo $? >"$D/srun.status.tmp" && mv "$D/srun.status.tmp" "$D/srun.status"',
    '} | tee "$D/agents.out"',
    "",
  }, "\n")
end

local function srun_status(dir)
  local s = read_file(dir .. "/srun.status")
  return s and tonumber(s:match("%d+"))
end

local function srun_pid(dir)
  local s = read_file(dir .. "/srun.pid")
  return s and tonumber(s:match("%d+"))
end

local function wait_srun(dir, seconds)
  local deadline = core.now() + seconds
  while srun_status(dir) == nil and core.now() < deadline do core.sleep(POLL) end
  return srun_status(dir) ~= nil
end

-- The agents' step id ("job.step"): from the agents' reports, else from
-- squeue (an agent that never started reports nothing).
local function agents_step(c)
  for _, t in pairs(M.parse_agent_output(read_file(c.dir .. "/agents.out"))) do
    if t.step then return t.step end
  end
  local out = capture("squeue -h -s -j " .. shq(c.job) .. " -o '%i %j' 2>/dev/null")
  for id, name in out:gmatch("(%S+) (%S+)") do
    if name == AGENT_STEP_NAME then return id end
  end
end

--- Ends the agents' job step (if one is running) and removes its directory.
-- grace: seconds to let it end by itself first (default M.STOP_GRACE; the
-- agents leave on monarch.shutdown()'s goodbye). Then scancel JOB.STEP, then
-- SIGTERM to srun (which cancels its step), then SIGKILL. Idempotent.
function M.stop(grace)
  local c = current
  if not c then return end
  current = nil
  grace = grace or M.STOP_GRACE
  if not wait_srun(c.dir, grace) then
    if grace > 0 then
      io.stderr:write("monarch: the agents' Slurm step did not end after the goodbye; cancelling it\n")
    end
    local step = agents_step(c)
    if step then capture("scancel " .. shq(step) .. " 2>&1") end
    local pid = srun_pid(c.dir)
    for _, sig in ipairs { "TERM", "KILL" } do
      if wait_srun(c.dir, M.CANCEL_GRACE) or not pid then break end
      capture("kill -" .. sig .. " " .. pid .. " 2>/dev/null")
    end
  end
  capture("rm -rf " .. shq(c.dir))
end

--- Starts one host agent per node of the current Slurm allocation and
-- returns their addresses, in Slurm's node order.
-- opts: token (the cluster token, required), worker (path of monarch-worker
-- on every node), getenv (for tests; default os.getenv). monarch.shutdown()
-- ends the agents' step (M.stop) once the procs are down.
-- Environment: SLURM_JOB_ID, SLURM_JOB_NODELIST (set by Slurm);
-- MONARCH_SLURM_TIMEOUT (seconds, default 60), MONARCH_SLURM_PORT (agent
-- port, default 0: any), MONARCH_SLURM_BIND (default 0.0.0.0),
-- MONARCH_SRUN_ARGS (extra srun options, default "--whole").
function M.slurm(opts)
  local getenv = opts.getenv or os.getenv
  if current then fail("the agents of this job are already running") end
  if type(opts.token) ~= "string" or opts.token == "" then fail("needs the cluster token") end
  if type(opts.worker) ~= "string" or opts.worker == "" then fail("needs the path of monarch-worker") end
  local job = getenv("SLURM_JOB_ID")
  if not job or job == "" then
    fail("not inside a Slurm allocation (SLURM_JOB_ID is not set): "
      .. "run monarch-run --slurm from an sbatch script or an salloc shell")
  end
  local nodelist = getenv("SLURM_JOB_NODELIST") or getenv("SLURM_NODELIST")
  if not nodelist or nodelist == "" then fail("SLURM_JOB_NODELIST is not set in job " .. job) end
  local timeout = tonumber(getenv("MONARCH_SLURM_TIMEOUT") or M.START_TIMEOUT)
  if not timeout or timeout <= 0 then
    fail("MONARCH_SLURM_TIMEOUT '" .. tostring(getenv("MONARCH_SLURM_TIMEOUT")) .. "' is not a positive number of seconds")
  end
  local port = getenv("MONARCH_SLURM_PORT") or "0"
  if not port:match("^%d+$") or tonumber(port) > 65535 then
    fail("MONARCH_SLURM_PORT '" .. port .. "' is not a port number")
  end
  local bind = getenv("MONARCH_SLURM_BIND") or "0.0.0.0"
  local listen = (bind:find(":", 1, true) and ("[" .. bind .. "]") or bind) .. ":" .. port
  local extra = words(getenv("MONARCH_SRUN_ARGS") or M.DEFAULT_SRUN_ARGS)

  local names_out, ok = capture("scontrol show hostnames " .. shq(nodelist) .. " 2>&1")
  local nodes = words(names_out)
  if not ok or #nodes == 0 then
    fail("cannot expand the node list '" .. nodelist .. "' of job " .. job .. " with scontrol: " .. names_out)
  end
  local node_addrs = M.parse_node_addrs((capture("scontrol show node -o " .. shq(nodelist) .. " 2>/dev/null")))

  local tmp = getenv("TMPDIR")
  if not tmp or tmp == "" then tmp = "/tmp" end
  local dir_out, dir_ok = capture("mktemp -d " .. shq(tmp .. "/monarch-slurm-" .. job .. ".XXXXXX") .. " 2>&1")
  local dir = dir_out:match("^%s*(.-)%s*$")
  if not dir_ok or dir == "" then fail("cannot make a private directory in " .. tmp .. ": " .. dir_out) end
  write_file(dir .. "/token", opts.token) -- mktemp -d made dir 0700: only we can read it
  write_file(dir .. "/launch.sh", launch_script(dir, #nodes, extra, opts.worker, listen))
  current = { dir = dir, job = job }
  -- In a session of its own: a Ctrl-C at `monarch-run --slurm -i` is the REPL's, and srun, which takes two
  -- within a second as "abort the step", must never hear it (setsid execs: the pid is the script's).
  local rc = os.execute("setsid sh " .. shq(dir .. "/launch.sh") .. " &")
  if rc ~= 0 and rc ~= true then -- LuaJIT returns the status, Lua 5.2+ a boolean
    M.stop(0)
    fail("cannot start the background srun (sh exited with " .. tostring(rc) .. ")")
  end

  -- Wait until every node's agent reported its port, or srun ended.
  local deadline = core.now() + timeout
  local tasks, ready
  while true do
    tasks, ready = M.parse_agent_output(read_file(dir .. "/agents.out"))
    if ready >= #nodes then break end
    local st = srun_status(dir)
    if st then
      current = nil
      capture("rm -rf " .. shq(dir))
      fail(string.format("srun ended (status %d) after %d of %d host agents started; see srun's messages above",
        st, ready, #nodes))
    end
    if core.now() > deadline then
      M.stop(0) -- agents that never met a controller do not leave by themselves
      fail(string.format("only %d of %d host agents reported their port within %gs (MONARCH_SLURM_TIMEOUT)",
        ready, #nodes, timeout))
    end
    core.sleep(POLL)
  end
  return M.agent_addresses(tasks, nodes, node_addrs)
end

--- Starts the host agents of this job with the launcher `name` ("slurm");
-- opts as for M.slurm. Returns their addresses.
function M.start(name, opts)
  if name == "slurm" then return M.slurm(opts) end
  error("monarch: unknown launcher '" .. tostring(name) .. "' (from --slurm or MONARCH_LAUNCHER; known: slurm, and ray: monarch.launch_ray)", 0)
end

return M
