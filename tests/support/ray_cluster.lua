-- tests/support/ray_cluster.lua: a real Ray cluster on this machine, for
-- tests/integration/ray_spec.lua and bench/ray.sh. A head and more nodes,
-- each its own raylet with its own CPUs and worker ports, all under a fresh
-- temp dir and on ports the kernel picked: nothing another cluster uses.
--   local rc = require "support.ray_cluster"
--   local py, why = rc.python()              -- the Python that has ray, or nil and why not
--   local c = rc.start{ nodes = 3 }          -- c.address: "127.0.0.1:PORT"
--   c:add_node(); c:kill_node(3); c:state()  -- {nodes =, pgs =, actors =}; c:stop()
-- stop ends only this cluster's processes (found by its temp dir, and their
-- children), by pid: never `ray stop`, which ends every Ray of the machine.
local shell = require "support.shell"

local M = {}
local Cluster = {}
Cluster.__index = Cluster

local VENV = "/opt/monarch-ray" -- where .ci/run installs ray (a test-only venv)
local WORKER_PORTS = 100        -- worker ports per node

--- The Python interpreter that can import ray (MONARCH_RAY_PYTHON, else the
-- test venv), or nil and why not.
function M.python()
  local py = os.getenv("MONARCH_RAY_PYTHON")
  if not py or py == "" then py = VENV .. "/bin/python" end
  local out, rc = shell.run(py .. " -c 'import ray; print(ray.__version__)'")
  if rc ~= 0 then
    return nil, "ray cannot be imported by " .. py .. " (.ci/run installs it into " .. VENV
      .. "; or set MONARCH_RAY_PYTHON): " .. (out:match("([^\n]+)\n?$") or "")
  end
  return py
end

local function bin(py) return (py:gsub("/python[%d.]*$", "")) end

-- A TCP port nothing listens on now (the kernel's pick).
local function free_port(py)
  local out = shell.run(py .. " -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])'")
  return tonumber(out:match("(%d+)"))
end

local function ray_start(c, args)
  local cmd = ("cd %s && RAY_USAGE_STATS_ENABLED=0 %s/ray start %s --disable-usage-stats 2>&1"):format(
    c.dir, bin(c.py), args)
  local out, rc = shell.run(cmd)
  if rc ~= 0 then error("ray start failed: " .. cmd .. "\n" .. out, 0) end
end

--- Starts a node of this cluster with `cpus` CPUs; returns its index (1: the head).
function Cluster:add_node(cpus)
  local i = #self.nodes + 1
  local lo = self.port_base + (i - 1) * WORKER_PORTS
  local node = { worker_ports = lo }
  local common = ("--num-cpus %d --min-worker-port %d --max-worker-port %d --node-ip-address 127.0.0.1"):format(
    cpus or 1, lo, lo + WORKER_PORTS - 1)
  if i == 1 then
    ray_start(self, ("--head --port %d --temp-dir %s/ray --include-dashboard=false --dashboard-port %d %s"):format(
      self.gcs_port, self.dir, free_port(self.py), common))
  else
    ray_start(self, ("--address %s %s"):format(self.address, common))
  end
  self.nodes[i] = node
  return i
end

--- The pids of this cluster's processes: those naming its temp dir, and all their descendants.
function Cluster:pids()
  -- The pattern's [/] keeps it from matching the shell that runs pgrep, whose command line holds it.
  local out = shell.run("pgrep -f '[/]" .. self.dir:sub(2) .. "/ray/'")
  local seen, list = {}, {}
  local function add(pid)
    if seen[pid] then return end
    seen[pid] = true
    list[#list + 1] = pid
    for child in shell.run("pgrep -P " .. pid):gmatch("%d+") do add(child) end
  end
  for pid in out:gmatch("%d+") do add(pid) end
  return list
end

--- Kills node i's raylet with SIGKILL, as a crash would (its workers then exit); returns the wall time.
function Cluster:kill_node(i)
  local lo = self.nodes[i].worker_ports
  local out = shell.run(("pgrep -f '[r]aylet/raylet .*%s/ray/.*--min_worker_port=%d '"):format(self.dir, lo))
  local pid = out:match("(%d+)")
  if not pid then error("no raylet for node " .. i .. " (worker ports from " .. lo .. ")", 2) end
  local t = tonumber((shell.run("date +%s.%N")))
  shell.quiet("kill -9 " .. pid)
  self.nodes[i].dead = true
  return t
end

--- What the cluster holds now: {nodes = alive, pgs = monarch:* not removed, actors = alive in namespace monarch}.
function Cluster:state()
  local out, rc = shell.run(("%s tests/ray/state.py %s"):format(self.py, self.address))
  local n, p, a = out:match("nodes (%d+) pgs (%d+) actors (%d+)")
  if rc ~= 0 or not n then error("tests/ray/state.py failed: " .. out, 2) end
  return { nodes = tonumber(n), pgs = tonumber(p), actors = tonumber(a) }
end

--- Ends every process of the cluster (TERM, then KILL) and removes its temp dir.
function Cluster:stop()
  for _, sig in ipairs { "TERM", "KILL" } do
    local pids = self:pids()
    if #pids == 0 then break end
    shell.quiet("kill -" .. sig .. " " .. table.concat(pids, " "))
    for _ = 1, 50 do -- up to 5 s for them to go
      if #self:pids() == 0 then break end
      shell.quiet("sleep 0.1")
    end
  end
  shell.quiet("rm -rf " .. self.dir)
end

--- Starts a cluster of opts.nodes nodes (default 3) of opts.cpus CPUs each (default 1).
function M.start(opts)
  opts = opts or {}
  local py = assert(M.python())
  local dir = (shell.run("mktemp -d /tmp/monarch-raytest.XXXXXX")):match("(%S+)")
  local c = setmetatable({ py = py, dir = dir, nodes = {} }, Cluster)
  c.gcs_port = free_port(py)
  c.address = "127.0.0.1:" .. c.gcs_port
  c.port_base = 10000 + (tonumber((shell.run("echo $$"))) or 0) % 180 * 100 -- below the ephemeral range
  local ok, err = pcall(function()
    for _ = 1, opts.nodes or 3 do c:add_node(opts.cpus) end
  end)
  if not ok then c:stop(); error(err, 0) end
  return c
end

--- The cluster whose temp dir is dir (one a killed run left), to stop it.
function M.at(dir) return setmetatable({ dir = dir, nodes = {} }, Cluster) end

return M
