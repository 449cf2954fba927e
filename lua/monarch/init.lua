--- monarch: one Lua script drives meshes of processes.
--   local monarch = require "monarch"
--   local procs = monarch.hosts():spawn_procs{ procs = 4 }
--   procs:load "basic"
--   print(procs:call("rank"):get())
local core = require "monarch.core"
local errors = require "monarch.errors"
local future = require "monarch.future"
local runtime = require "monarch.runtime"
local mesh = require "monarch.mesh"
local value_mesh = require "monarch.value_mesh"
local tensor = require "monarch.tensor"
-- The modules that make ProcMesh methods besides monarch.mesh (mesh.METHODS lists which):
-- loaded now so that every method is there from the start.
require "monarch.actor"
require "monarch.collective"
require "monarch.gpu"
local persist = require "monarch.persist"
local trace = require "monarch.trace"
local join = require "monarch.join" -- hosts that join the job: HostMesh:on_join/refresh, ProcMesh:grow
-- The trace names each host's BLAS core type, from the hosts' STATUS at stop (trace.lua is a leaf).
trace.set_host_status(function(agents) return require("monarch.status").collect(agents) end)
local ship = require "monarch.ship" -- libraries and files shipped to hosts that lack them: HostMesh:sync

local M = { _VERSION = core.version } -- host/core/version.h

--- Settings monarch-run fills in from its command line: hosts ({"h:p", ...}).
M.config = M.config or {}

local host_mesh -- the HostMesh of this script, made once
local told_agent_exit -- the hook that reports the local host agent's exit is in
local launched -- monarch.launch or launch_ray, once a launcher started the agents: shutdown ends them

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return (s:gsub("[ \t\r\n]+$", "")) -- trimmed like auth.c trims token files
end

local function token_from_env()
  local t = os.getenv("MONARCH_TOKEN")
  if t and t ~= "" then return t end
  local file = os.getenv("MONARCH_TOKEN_FILE")
  if file and file ~= "" then
    return read_file(file) or error("cannot read MONARCH_TOKEN_FILE " .. file, 0)
  end
end

local function worker_path()
  local w = os.getenv("MONARCH_WORKER")
  if w and w ~= "" then return w end
  local prefix = core.prefix() or error("cannot locate the monarch install prefix", 0)
  return prefix .. "/bin/monarch-worker"
end

--- The hosts of this job as a HostMesh: from monarch-run --hosts (or the
-- MONARCH_HOSTS variable, "h1:port,h2:port"), else this machine, with a host
-- agent started as a child process. Once called, monarch.hosts_from says
-- which: "hosts", a launcher's name ("slurm", "ray"), or "local".
function M.hosts()
  if host_mesh then return host_mesh end
  -- monarch-run's --quiet and --log-level arrive in M.config after this module loads.
  if M.config.quiet then M.log.quiet = true end
  if M.config.log_level then M.log.level = M.config.log_level end
  local addrs = M.config.hosts
  local env = os.getenv("MONARCH_HOSTS")
  if not addrs and env and env ~= "" then
    addrs = {}
    for a in env:gmatch("[^,%s]+") do addrs[#addrs + 1] = a end
  end
  local launcher = M.config.launcher or os.getenv("MONARCH_LAUNCHER")
  if launcher == "ray" and (M.config.status or M.config.top) then -- watch a job Ray runs: find its agents
    if addrs then error("--ray and --hosts/MONARCH_HOSTS cannot be used together", 2) end
    addrs, launcher = require("monarch.launch_ray").find(M.config, token_from_env()), nil
  end
  if launcher and launcher ~= "" then -- agents started by a cluster manager (monarch.launch)
    if addrs then error("a launcher (" .. launcher .. ") and --hosts/MONARCH_HOSTS cannot be used together", 2) end
    runtime.init(token_from_env() or core.generate_token())
    M.hosts_from = launcher
    if launcher == "ray" then -- the agents join the mesh it returns (join.attach is done)
      launched = require "monarch.launch_ray"
      host_mesh = launched.start { token = runtime.token, worker = worker_path(), config = M.config }
      return host_mesh
    end
    launched = require "monarch.launch"
    addrs = launched.start(launcher, { token = runtime.token, worker = worker_path() })
  elseif addrs and #addrs > 0 then
    local tok = token_from_env()
    if not tok then
      error("connecting to --hosts needs the cluster token: set MONARCH_TOKEN or MONARCH_TOKEN_FILE", 2)
    end
    runtime.init(tok)
    M.hosts_from = "hosts"
  else
    M.hosts_from = "local"
    runtime.init(token_from_env() or core.generate_token())
    local port, err = core.start_agent(worker_path(), runtime.token)
    if not port then error("cannot start the local host agent: " .. tostring(err), 2) end
    addrs = { "127.0.0.1:" .. port }
    if not told_agent_exit then -- once, should hosts() be called again after a failed connect
      told_agent_exit = true
      table.insert(runtime.hooks.agent_exit, function(st)
        if not mesh.shutting_down then
          io.stderr:write(string.format("monarch: the local host agent exited (status %s, signal %s)\n",
            tostring(st.status), tostring(st.signal)))
        end
      end)
    end
  end
  host_mesh = mesh.host_mesh(mesh.connect_agents(addrs))
  join.attach(host_mesh, M.config) -- joined hosts go here; --listen-joins opens the join port
  return host_mesh
end

mesh.set_job(M.hosts, M.config) -- persist and join reach the job's hosts through monarch.mesh

--- Runs fn(...) as a task; inside it, future:await() yields to other tasks.
-- Returns a Future of fn's return value.
M.spawn = runtime.spawn

--- A Future of the list of values of futs, failing with the first error.
function M.all(futs)
  local f = future.new("all")
  local n, left, values = #futs, #futs, {}
  if n == 0 then f:resolve(values) end
  for i, x in ipairs(futs) do
    x:on_done(function(d)
      local ok, v = d:result()
      d.observed = true
      if not ok then return f:fail(v) end
      values[i] = v
      left = left - 1
      if left == 0 then f:resolve(values) end
    end)
  end
  return f
end

--- Sleeps s seconds while the loop runs (yields inside a task).
function M.sleep(s)
  if type(s) ~= "number" or s < 0 then error("monarch.sleep wants a non-negative number of seconds", 2) end
  local f = future.new("sleep")
  runtime.at(runtime.now() + s, function() f:resolve(true) end)
  return f:await()
end

--- Seconds on a monotonic clock.
M.now = core.now

--- Failure detection settings (seconds): heartbeat (interval between pings),
-- heartbeat_timeout (silence that marks a connection lost; a proc whose host
-- agent still answers is then declared unresponsive and killed) and
-- reconnect (how long a lost connection is retried before its procs fail);
-- cast_min, fanout, and direct_max / direct_idle (the pool of direct links
-- a large mesh's procs share): docs/lua-api.md.
function M.configure(t)
  if type(t) ~= "table" then error("monarch.configure wants a table", 2) end
  if not runtime.initialized then error("monarch.configure: call monarch.hosts() first", 2) end
  core.configure(t)
  -- Agents watch their procs with the same timeout (procs spawned from now on).
  if type(t.heartbeat_timeout) == "number" then require("monarch.procs").hang_timeout = t.heartbeat_timeout end
end

--- fn(ev) is called once for each host lost for good (kind host_lost: ev.host, ev.addr, ev.cause,
-- ev.ranks): its agent's address refuses connections, or it stayed unreachable for the reconnect
-- window. Without a handler (and with no call waiting on its procs) the event stops the script.
-- mesh:survivors() is the mesh without the lost hosts. Returns a function that removes fn.
function M.on_host_loss(fn) return require("monarch.procs").on_host_loss(fn) end

-- Stops tracing (monarch.trace.stop) and says on stderr where the trace went.
local function stop_trace()
  local s = trace.stop()
  io.stderr:write(string.format("monarch: trace written to %s: %d spans from %d procs%s (open it in ui.perfetto.dev)\n",
    s.path, s.spans, s.procs, s.dropped > 0 and (", " .. s.dropped .. " dropped") or ""))
end

local function shutdown()
  local ok, err = true, nil
  if runtime.initialized then
    ok, err = pcall(runtime.drain_tasks)
    -- Output the procs printed last is still on its way through the agents.
    pcall(M.log.drain)
  end
  local tok, terr = true, nil
  if trace.active() then tok, terr = pcall(stop_trace) end -- the procs are still there to hand in their spans
  mesh.shutting_down = true
  require("monarch.procs").shutting_down = true
  core.shutdown()
  if not ok then error(err, 0) end
  if not tok then error(terr, 0) end
end
--- Waits for every task, then stops all procs and host agents this script started.
function M.shutdown()
  if not launched then return shutdown() end
  local ok, err = pcall(shutdown)
  if launched then launched.stop() end -- after the goodbye, which the agents leave on
  if not ok then error(err, 0) end
end

--- Opens the join port for hosts started later (`monarch-worker --join ADDR`):
-- monarch.listen{addr = "0.0.0.0:7100"} returns the address (monarch.join).
M.listen = join.listen

M.log = require "monarch.log"
M.ship = ship -- monarch.ship.stats(): the bytes of shipped files this controller wrote
M.attach, M.persistent = persist.attach, persist.list

--- Prints each host's procs (state, uptime, queued and executed calls, the
-- kernel running) and recent exits; `monarch-run --status --hosts ...` calls it.
function M.status(out) return require("monarch.status").print(M, out) end

--- The job's timeline (monarch.trace): trace.start(path) ... trace.stop() writes trace-event JSON.
M.trace = trace
-- MONARCH_TRACE=path traces the whole run; shutdown writes it, after a failure too.
local trace_env = os.getenv("MONARCH_TRACE")
if trace_env and trace_env ~= "" and not trace.active() then
  local ok, err = pcall(trace.start, trace_env)
  if not ok then error("MONARCH_TRACE=" .. trace_env .. ": " .. tostring(err), 0) end
end

--- A live full-screen view of every host and proc (state, calls/s, queue,
-- the kernel running and for how long, CPU, memory, failures), refreshed
-- every second until q or Ctrl-C; `monarch-run --top` and top() in the REPL
-- call it. opts.retry: reconnect to hosts that were lost. See monarch.top.
function M.top(opts) return require("monarch.top").run(M, opts) end

M.errors, M.future, M.value_mesh, M.tensor, M.runtime = errors, future, value_mesh, tensor, runtime
M.Future, M.ValueMesh = future.Future, value_mesh.ValueMesh
return M
