-- tests/support/agent.lua: a host agent daemon of a spec's own (`monarch-worker
-- --listen HOST:0`), started in the background and stopped again.
--
--   local agent = require "support.agent"
--   local a = agent.start{ token = runtime.token, env = "MONARCH_HOST_KEY=x" }
--   ... mesh.connect_agents{ a.addr } ...
--   a:stop()
local M = {}

local B = os.getenv("MONARCH_BUILD") or "build"

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local s = f:read("*a")
  f:close()
  return s
end

local Agent = {}
Agent.__index = Agent

--- Everything the agent has written to stdout and stderr so far.
function Agent:output() return slurp(self.log) end

-- Whether pid is still the monarch-worker we started: one that exited by itself (--once) may have
-- handed its pid to another process by now (pids wrap at 32768 on a busy machine).
local function ours(pid)
  local f = io.open("/proc/" .. pid .. "/cmdline", "rb")
  if not f then return false end
  local cmd = f:read("*a")
  f:close()
  return cmd:find("monarch-worker", 1, true) ~= nil
end

--- Kills the agent (SIGTERM, or the signal given) if it still runs, and removes its log.
function Agent:stop(signal)
  if self.pid and ours(self.pid) then
    os.execute(("kill %s %d 2>/dev/null"):format(signal and "-" .. signal or "", self.pid))
  end
  self.pid = nil
  os.remove(self.log)
end

--- Starts an agent and waits until it reports its port. opts:
--   token  the cluster token (required)
--   env    shell words before the command: "A=1 B=2", "env -u X"
--   args   extra arguments, e.g. "--orphan-timeout 1"
--   host   address to listen on (default 127.0.0.1)
--   wrap   a command to run it under, e.g. "ip netns exec ns"
--   hosts  how many agents the process runs (args "--simulate --hosts N"): waits for each one's port
-- Returns {addr = "host:port" (the first), addrs (every agent's), port, pid, log} with :output() and :stop().
function M.start(opts)
  local host, wrap = opts.host or "127.0.0.1", opts.wrap or ""
  local log = os.tmpname()
  local f = io.popen(("%s env MONARCH_TOKEN='%s' %s %s/bin/monarch-worker --listen %s:0 %s >%s 2>&1 & echo $!")
    :format(wrap, assert(opts.token, "agent.start: token"), opts.env or "", B, host, opts.args or "", log))
  local pid = tonumber(f:read("*l"))
  f:close()
  local ports, want = {}, opts.hosts or 1
  for _ = 1, 200 do
    ports = {}
    for p in slurp(log):gmatch("listening on [^\n]-:(%d+)") do ports[#ports + 1] = tonumber(p) end
    if #ports >= want then break end
    os.execute("sleep 0.025")
  end
  local a = setmetatable({ pid = pid, log = log, wrap = wrap, port = ports[1] }, Agent)
  if #ports < want then
    local out = a:output()
    a:stop()
    error(("the host agent reported %d of %d ports; it said: %s"):format(#ports, want, out), 2)
  end
  a.addr = host .. ":" .. ports[1]
  a.addrs = {}
  for i, p in ipairs(ports) do a.addrs[i] = host .. ":" .. p end
  return a
end

--- For a describe block: n agents with token (a string, or a function returning one) started before each case
-- and killed after it (their procs follow them). Returns the list (refilled per case) and addrs(k): the first k
-- agents' addresses, comma-separated (k defaults to all).
function M.per_case(n, token)
  local list, env = {}, getfenv(2) -- busted's before_each and after_each live in the spec file's environment
  env.before_each(function()
    for i = 1, n do list[i] = M.start { token = type(token) == "function" and token() or token } end
  end)
  env.after_each(function()
    for i = #list, 1, -1 do
      list[i]:stop(9)
      list[i] = nil
    end
    os.execute("sleep 0.2") -- PR_SET_PDEATHSIG: give the procs a moment to go
  end)
  local function addrs(k)
    local a = {}
    for i = 1, k or #list do a[i] = list[i].addr end
    return table.concat(a, ",")
  end
  return list, addrs
end

return M
