--- monarch.launch_ray: host agents on a Ray cluster (monarch-run --ray).
-- monarch.launch calls M.start when the launcher is "ray". The Ray side is
-- deploy/ray/monarch_ray.py (installed as share/monarch/ray/monarch_ray.py),
-- run as our child: it reserves a STRICT_SPREAD placement group, one bundle
-- per host, and starts `monarch-worker --join` in an actor per bundle. The
-- agents join this controller's join port (monarch.join), so the first hosts,
-- and with --ray-elastic the nodes Ray adds later, come in the same way.
--
-- The pipe to the launcher: its stdin is ours (io.popen "w"). The first line
-- is the cluster token; "stop" asks for teardown; EOF (we ended, or were
-- killed) does the same. Its status lines go to a file in a private
-- directory (mktemp -d, 0700) that we read as it grows; the directory is
-- removed as soon as both ends have the file open. The agents run with
-- --once, so monarch.shutdown()'s goodbye ends them; M.stop then ends the
-- launcher, which kills the actors and removes the placement group.
local core = require "monarch.core"
local errors = require "monarch.errors"
local log = require "monarch.log"
local mesh = require "monarch.mesh"
local join = require "monarch.join"
local runtime = require "monarch.runtime"
local ffi = require "ffi"

pcall(ffi.cdef, "int getpid(void);") -- in a pcall: another module may have declared it

local M = {}

M.START_TIMEOUT = 60 -- seconds to place the group and have every agent join (--ray-timeout)
M.STOP_GRACE = 15    -- seconds the launcher gets to tear down after "stop" before it is killed
local POLL = 0.05    -- seconds between looks at the status file while starting
local NOTE_EVERY = 0.25 -- seconds between looks at it while the job runs
local PLACED_WAIT = 1    -- seconds to wait, once all agents joined, for the lines that say where each is
local PLACED_POLL = 0.005 -- seconds between looks for them meanwhile
local STOP_POLL = 0.01  -- seconds between looks for the launcher's exit after "stop" (it exits at once)

-- --ray-NAME options: how each is read. monarch-run passes them as strings (config.ray).
local OPTIONS = {
  address = "string", hosts = "count", cpus = "amount", gpus = "amount", elastic = "flag",
  ["max-hosts"] = "count", timeout = "amount", job = "string",
}

local current -- the running launch: {pipe, dir, pid, status = file handle, lines, hosts = {i = info}}

-- One line, no traceback: monarch-run prints a MonarchError as it is.
local function fail(msg) error(errors.new { kind = "launch", message = "ray: " .. msg }, 0) end

local function shq(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function capture(cmd)
  local f = io.popen(cmd .. " 2>&1; echo \"::rc=$?\"")
  local out = f and f:read("*a") or ""
  if f then f:close() end
  return (out:gsub("::rc=%d+%s*$", "")), tonumber(out:match("::rc=(%d+)%s*$")) == 0
end

--- The --ray options (config.ray: {name = string}) checked and converted:
-- {address, hosts, cpus, gpus, elastic, max_hosts, timeout}. Raises on a bad one.
function M.options(raw, getenv)
  getenv = getenv or os.getenv
  local o = { cpus = 1, gpus = 0, hosts = 0, max_hosts = 0, timeout = M.START_TIMEOUT }
  local names = {}
  for k in pairs(OPTIONS) do if k ~= "address" then names[#names + 1] = "--ray-" .. k end end
  table.sort(names)
  for name, v in pairs(raw or {}) do
    local kind = OPTIONS[name]
    if not kind then fail("unknown option --ray-" .. tostring(name) .. " (known: " .. table.concat(names, ", ") .. ")") end
    local n = tonumber(v)
    local key = name:gsub("%-", "_")
    if kind == "flag" then
      o[key] = true
    elseif kind == "string" then
      o[key] = v
    elseif not n or n < 0 or (kind == "count" and (n ~= math.floor(n) or n < 1)) then
      fail(string.format("--ray-%s wants %s, got '%s'", name,
        kind == "count" and "a whole number of at least 1" or "a non-negative number", tostring(v)))
    else
      o[key] = n
    end
  end
  if o.cpus == 0 and o.gpus == 0 then fail("--ray-cpus and --ray-gpus are both 0: a host bundle must reserve something") end
  if o.timeout <= 0 then fail("--ray-timeout wants a positive number of seconds") end
  if o.max_hosts > 0 and not o.elastic then fail("--ray-max-hosts is for --ray-elastic") end
  if o.max_hosts > 0 and o.hosts > o.max_hosts then fail("--ray-hosts is above --ray-max-hosts") end
  if not o.address or o.address == "" then
    local env = getenv("RAY_ADDRESS")
    o.address = (env and env ~= "") and env or nil
  end
  return o
end

--- Parses one status line of the launcher into an event table (pure; tested without Ray).
function M.parse_line(line)
  local word, rest = line:match("^(%S+)%s*(.*)$")
  if not word then return nil end
  if word == "host" or word == "joined" then
    local i, node, host, pid = rest:match("^(%d+) (%S+) (%S+) (%d+)")
    if i then return { what = word, index = tonumber(i), node = node, host = host, pid = tonumber(pid) } end
  elseif word == "ended" then
    local i, why = rest:match("^(%d+)%s*(.*)$")
    if i then return { what = word, index = tonumber(i), why = why } end
  elseif word == "pid" or word == "reserved" then
    return { what = word, n = tonumber(rest:match("^(%d+)")), name = rest:match("^%d+ (%S+)") }
  elseif word == "node-dead" then
    local node, t = rest:match("^(%S+) ([%d.]+)")
    return { what = word, node = node, time = tonumber(t) }
  else
    return { what = word, text = rest }
  end
end

-- New complete lines of the status file, as events.
local function read_events(c)
  local chunk = c.status and c.status:read("*a")
  if not chunk or chunk == "" then return {} end
  c.partial = (c.partial or "") .. chunk
  local evs = {}
  while true do
    local line, rest = c.partial:match("^([^\n]*)\n(.*)$")
    if not line then break end
    c.partial = rest
    local ev = M.parse_line(line)
    if ev then evs[#evs + 1] = ev end
  end
  return evs
end

-- Whether the launcher process has exited (a zombie until the pipe is closed, or gone).
local function exited(pid)
  if not pid then return false end
  local f = io.open("/proc/" .. pid .. "/stat", "r")
  if not f then return true end
  local s = f:read("*l") or ""
  f:close()
  return s:match("%) (%a)") == "Z"
end

-- What the launcher tells while the job runs: logged, and hosts' records kept.
local function note(c, ev)
  if ev.what == "host" or ev.what == "joined" then
    c.hosts[ev.index] = ev
    if ev.what == "joined" then
      log.log("info", string.format("ray: node %s added (host %d): its agent joins", ev.node, ev.index))
    end
  elseif ev.what == "ended" then
    log.log("info", string.format("ray: host %d: %s", ev.index, ev.why))
  elseif ev.what == "node-dead" then
    c.dead[ev.node] = ev.time
    log.log("warn", "ray: node " .. ev.node .. " is dead (Ray's own detection)")
  elseif ev.what == "note" or ev.what == "error" then
    log.log(ev.what == "note" and "info" or "warn", "ray: " .. ev.text)
  elseif ev.what == "reserved" then
    c.wanted, c.pg = ev.n, ev.name
  elseif ev.what == "pid" then
    c.pid = ev.n
  end
end

local function private_dir()
  local tmp = os.getenv("TMPDIR")
  if not tmp or tmp == "" then tmp = "/tmp" end
  local out, ok = capture("mktemp -d " .. shq(tmp .. "/monarch-ray.XXXXXX"))
  local dir = out:match("^%s*(.-)%s*$")
  if not ok or dir == "" then fail("cannot make a private directory in " .. tmp .. ": " .. out) end
  return dir
end

-- The launcher's command line so far: the Python, the script, the cluster's address.
local function launcher_base(o)
  local py = os.getenv("MONARCH_RAY_PYTHON")
  if not py or py == "" then py = "python3" end
  local script = os.getenv("MONARCH_RAY_LAUNCHER")
  if not script or script == "" then script = (core.prefix() or ".") .. "/share/monarch/ray/monarch_ray.py" end
  local args = { shq(py), shq(script), "--timeout", o.timeout }
  if o.address then args[#args + 1] = "--address " .. shq(o.address) end
  return args
end

local function launcher_command(o, opts, join_addr, name, dir)
  local args = launcher_base(o)
  for _, a in ipairs { "--join", shq(join_addr), "--worker", shq(opts.worker), "--name", shq(name),
    "--hosts", o.hosts, "--cpus", o.cpus, "--gpus", o.gpus, "--max-hosts", o.max_hosts } do
    args[#args + 1] = a
  end
  if o.elastic then args[#args + 1] = "--elastic" end
  -- The shell says its pid (python's, after exec) first: a launcher that cannot start is seen to end.
  return "exec 3>" .. shq(dir .. "/status") .. "; echo pid $$ >&3; exec " .. table.concat(args, " ")
end

-- The controller's join address as the agents are to reach it. A wildcard bind stays one: the
-- launcher puts in this node's address as Ray knows it, unless MONARCH_RAY_CONTROLLER_HOST names one.
local function reachable(bound, getenv)
  local host, port = bound:match("^%[?([^%]]+)%]?:(%d+)$")
  local env = getenv("MONARCH_RAY_CONTROLLER_HOST")
  if (host == "0.0.0.0" or host == "::") and env and env ~= "" then host = env end
  return (host:find(":", 1, true) and "[" .. host .. "]" or host) .. ":" .. port
end

-- The job's name in Ray (placement group, actors): the script's name and our pid.
local function job_name()
  local script = _G.arg and tostring(_G.arg[0]) or ""
  local base = script:match("([^/]+)%.lua$") or "job" -- -e code has no script name
  return (base:gsub("[^%w%-_.]", "_")) .. "-" .. ffi.C.getpid()
end

-- Puts the hosts in bundle order (host I of the mesh is bundle I), matching agents by hostname and pid.
local function order_hosts(h, c)
  local rank = {}
  for i, info in pairs(c.hosts) do rank[info.host .. "/" .. info.pid] = i end
  table.sort(h.agents, function(a, b)
    return (rank[tostring(a.hostname) .. "/" .. tostring(a.pid)] or math.huge)
      < (rank[tostring(b.hostname) .. "/" .. tostring(b.pid)] or math.huge)
  end)
  for i, a in ipairs(h.agents) do a.index = i - 1 end
end

-- Whether the launcher has said which bundle each agent of h is on ("host" lines: order_hosts).
local function all_placed(h, c)
  local known = {}
  for _, info in pairs(c.hosts) do known[info.host .. "/" .. info.pid] = true end
  for _, a in ipairs(h.agents) do
    if not known[tostring(a.hostname) .. "/" .. tostring(a.pid)] then return false end
  end
  return true
end

-- Waits until every bundle's agent has joined h (and the launcher has said where each is, or
-- PLACED_WAIT seconds passed), the launcher failed, or the time is up.
local function wait_joined(h, c, timeout)
  local deadline = core.now() + timeout + 30 -- the launcher's own timeout ends first, with its reason
  local joined_at
  while true do
    for _, ev in ipairs(read_events(c)) do
      if ev.what == "error" then M.stop(0); fail(ev.text) end
      note(c, ev)
    end
    if c.wanted and #h.agents >= c.wanted then
      joined_at = joined_at or core.now()
      if all_placed(h, c) or core.now() - joined_at > PLACED_WAIT then return end
    end
    if exited(c.pid) then
      M.stop(0)
      fail("the launcher (" .. (os.getenv("MONARCH_RAY_PYTHON") or "python3") .. ") exited before the hosts joined; see its messages above")
    end
    if core.now() > deadline then
      local n = #h.agents
      M.stop(0)
      fail(string.format("%d of %s host agents joined within %gs", n, tostring(c.wanted or "?"), timeout))
    end
    runtime.pump(joined_at and PLACED_POLL or POLL) -- the "host" lines are no event of the loop's
  end
end

--- Starts the hosts of this job on Ray and returns the job's HostMesh,
-- with every bundle's agent in it (host I: bundle I).
-- opts: token, worker (monarch-worker's path on every node), config
-- (monarch.config: ray = {--ray-NAME = value}, listen_joins, name).
function M.start(opts)
  if current then fail("the hosts of this job are already running") end
  local config = opts.config or {}
  local o = M.options(config.ray, opts.getenv)
  if o.job then fail("--ray-job picks the job that --status or --top watches; a job's own name is its script's and pid") end
  -- No hosts yet (a shape needs one): monarch.join's admit gives it its shape as the agents come in.
  local h = setmetatable({ agents = {} }, mesh.HostMesh)
  join.attach(h, config) -- opens --listen-joins if given
  if not join.address then join.listen { addr = "0.0.0.0:0" } end
  local name = job_name()
  local dir = private_dir()
  local cmd = launcher_command(o, opts, reachable(join.address, opts.getenv or os.getenv), name, dir)
  local c = { dir = dir, hosts = {}, dead = {} }
  c.pipe = io.popen(cmd, "w")
  if not c.pipe then capture("rm -rf " .. shq(dir)); fail("cannot start " .. cmd) end
  current = c
  c.pipe:write(opts.token, "\n")
  c.pipe:flush()
  local deadline = core.now() + 10
  repeat -- the shell opens the status file before python starts
    c.status = io.open(dir .. "/status", "r")
    if not c.status then core.sleep(0.01) end
  until c.status or core.now() > deadline
  -- Both ends hold the file open now: the directory can go, so not even a kill -9 leaves it behind.
  capture("rm -rf " .. shq(dir))
  if not c.status then M.stop(0); fail("the launcher's shell never opened its status file") end
  wait_joined(h, c, o.timeout)
  order_hosts(h, c)
  log.log("info", string.format("ray: %d hosts in placement group %s", #h.agents, tostring(c.pg)))
  local last = 0
  runtime.tick(function() -- every pump, but the file is read at most every NOTE_EVERY seconds
    local now = core.now()
    if current ~= c or now - last < NOTE_EVERY then return end
    last = now
    for _, ev in ipairs(read_events(c)) do note(c, ev) end
  end)
  return h
end

--- Where the agents of a job running on the Ray cluster listen, asked of
-- its host actors (the launcher's --find): {"HOST:PORT", ...} in host order
-- and the job's name, for `monarch-run --ray --status` and `--top`.
-- config.ray: --ray-NAME options; job (--ray-job NAME) picks one of several
-- jobs. token: the one the job runs with (the caller's; checked first).
-- Raises, with the launcher's one line, when none or several run.
function M.find(config, token, getenv)
  if not token then
    fail("--status and --top under --ray need the job's cluster token: set MONARCH_TOKEN or MONARCH_TOKEN_FILE "
      .. "to the one it was started with")
  end
  local o = M.options(config and config.ray, getenv)
  local args = launcher_base(o)
  args[#args + 1] = "--find"
  if o.job then args[#args + 1] = "--name " .. shq(o.job) end
  -- Its status lines come on our pipe (fd 3 to it); its own output goes to our stderr.
  local f = io.popen("exec 3>&1 1>&2; exec " .. table.concat(args, " "), "r")
  local text = f and f:read("*a") or ""
  if f then f:close() end
  local addrs, name = {}, nil
  for line in text:gmatch("[^\n]+") do
    local ev = M.parse_line(line)
    if ev and ev.what == "error" then fail(ev.text) end
    local addr = line:match("^agent %d+ (%S+)$")
    if addr then addrs[#addrs + 1] = addr end
    name = name or line:match("^found %d+ (%S+)$")
  end
  if not name then fail("the launcher (" .. (os.getenv("MONARCH_RAY_PYTHON") or "python3") .. ") found no job; see its messages above") end
  if #addrs == 0 then fail("job " .. name .. " has no agent listening") end
  return addrs, name
end

--- Ends the launcher: "stop", then up to `grace` seconds (default
-- M.STOP_GRACE) for it to kill the actors and remove the placement group,
-- then SIGKILL (Ray removes what a dead driver owned). Idempotent.
function M.stop(grace)
  local c = current
  if not c then return end
  current = nil
  grace = grace or M.STOP_GRACE
  pcall(function() c.pipe:write("stop\n"); c.pipe:flush() end)
  local deadline = core.now() + grace
  if not c.pid then -- it has not said who it is yet
    for _, ev in ipairs(read_events(c)) do note(c, ev) end
  end
  while c.pid and not exited(c.pid) and core.now() < deadline do core.sleep(STOP_POLL) end
  if c.pid and not exited(c.pid) then
    if grace > 0 then io.stderr:write("monarch: the Ray launcher did not end after stop; killing it\n") end
    capture("kill -9 " .. c.pid)
  end
  pcall(c.pipe.close, c.pipe)
  if c.status then c.status:close() end
  capture("rm -rf " .. shq(c.dir))
end

return M
