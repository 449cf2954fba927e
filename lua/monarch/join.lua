--- Hosts that join a running job, and meshes that grow onto them.
--   monarch.listen{ addr = "0.0.0.0:7100" }  -- the join port (or monarch-run --listen-joins ADDR)
--   hosts:on_join(function(agent) ... end)  -- a task, once a new host agent is connected
--   hosts:refresh()                          -- re-reads the --hostfile: its new lines join too
--   local grown, added = procs:grow{ agent } -- procs on the new hosts; grown = procs + added
--   w:copy_from_peer(grown):get()            -- the new procs' w, copied from a healthy proc
-- A host joins by `monarch-worker --join ADDR` (docs/operations.md): the
-- agent proves it holds the cluster token on the join port
-- (host/controller/ctl_join.c), and the controller dials it back like any
-- host agent. Nothing listens until the script asks.
local core = require "monarch.core"
local errors = require "monarch.errors"
local log = require "monarch.log"
local mesh = require "monarch.mesh"
local procs_mod = require "monarch.procs"
local runtime = require "monarch.runtime"
local shape_mod = require "monarch.shape"

local M = {}
local HostMesh = mesh.HostMesh

--- The address the join port listens on ("HOST:PORT"), or nil.
M.address = nil

local target          -- the HostMesh agents from the join port go into (monarch.hosts())
local connecting = {} -- agent record -> the HostMesh it is to join, once connected
local ticking = false

-- ---- agents joining a HostMesh ------------------------------------------------------

local function split_addr(addr)
  local host, port = tostring(addr):match("^%[?([^%]]+)%]?:(%d+)$")
  return host, tonumber(port)
end

-- The record of the agent at host:port that h has or is dialling (not a dead one).
local function known(h, host, port)
  for _, a in ipairs(h.agents) do
    if a.addr == host and a.port == port and a.state ~= "dead" then return a end
  end
  for a, into in pairs(connecting) do
    if into == h and a.addr == host and a.port == port then return a end
  end
end

-- The host of h that a is the same agent process as, reached at another
-- address (a hostfile's DNS name and a JOIN's pod address, say), if any.
local function same_agent(h, a)
  if not a.pid or a.pid == 0 then return nil end
  for _, b in ipairs(h.agents) do
    if b ~= a and b.state ~= "dead" and b.pid == a.pid and b.hostname == a.hostname then return b end
  end
end

-- Runs h's on_join handlers for agent a, each as a task; a handler's failure stops the script.
local function announce(h, a)
  for _, fn in ipairs(h._on_join or {}) do
    runtime.spawn(fn, a):on_done(function(d)
      local ok, err = d:result()
      if not ok then
        runtime.unhandled(errors.new { kind = "script", host = a.addr .. ":" .. a.port,
          message = "on_join handler failed: " .. tostring(err) })
      end
    end)
  end
end

-- a is connected: it becomes the last host of h.
local function admit(h, a)
  a.index = #h.agents
  h.agents[#h.agents + 1] = a
  h.shape = shape_mod.new({ "hosts" }, { #h.agents })
  log.log("info", string.format("host %s (%s:%d) joined: %d hosts", tostring(a.hostname), a.addr, a.port, #h.agents))
  announce(h, a)
end

-- Dials the agent at addr ("HOST:PORT") for h. Returns its record and whether it is a new one.
local function add(h, addr, how)
  local host, port = split_addr(addr)
  if not host then error("host address '" .. tostring(addr) .. "' is not HOST:PORT", 3) end
  local a = known(h, host, port)
  if a then return a, false end
  a = { addr = host, port = port, joined = how }
  procs_mod.connect_agent(a)
  connecting[a] = h
  return a, true
end

-- Every pump: takes what the join port let in, and admits the agents that are connected now.
local function tick()
  local evs, dropped = nil, 0
  if M.address then evs, dropped = core.joins() end
  if evs then
    for _, e in ipairs(evs) do
      if e.addr then
        if target then add(target, e.addr, "join") end
      else
        log.log(e.quiet and "debug" or "warn", "refused a join from " .. e.peer .. ": " .. e.refused)
      end
    end
    if dropped > 0 then log.log("warn", string.format("refused %d more joins (not shown)", dropped)) end
  end
  for a, h in pairs(connecting) do
    local twin = a.state == "ready" and same_agent(h, a)
    if twin then
      connecting[a] = nil
      core.disconnect(a.conn, "already a host of this job")
      log.log("info", string.format("host agent at %s:%d is host %d of this job already (%s:%d); not added again",
        a.addr, a.port, twin.index or 0, twin.addr, twin.port))
    elseif a.state == "ready" then
      connecting[a] = nil
      admit(h, a)
    elseif a.state ~= "connecting" then
      connecting[a] = nil
      log.log("warn", string.format("host agent %s:%d cannot be reached: %s", a.addr, a.port, tostring(a.reason)))
    end
  end
end

local function ensure_ticking()
  if not ticking then
    ticking = true
    runtime.tick(tick)
  end
end

--- Makes h the HostMesh that agents from the join port join (monarch.hosts()
-- calls it), and opens the join port if monarch-run was given
-- --listen-joins (config.listen_joins) or MONARCH_JOIN_ADDR is set.
function M.attach(h, config)
  target = h
  local addr = config and config.listen_joins
  local env = os.getenv("MONARCH_JOIN_ADDR")
  if not addr and env and env ~= "" then addr = env end
  if addr and not M.address then M.listen { addr = addr } end
end

--- Opens the join port: host agents started with `monarch-worker --join
-- ADDR` and the cluster token join this job's hosts (monarch.hosts()).
-- opts.addr: a numeric "HOST:PORT" (port 0: any free one; default
-- "127.0.0.1:0"). Prints and returns the address it listens on. Raises if
-- it cannot listen, or already does.
function M.listen(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("listen wants a table like {addr = '0.0.0.0:7100'}", 2) end
  for k in pairs(opts) do
    if k ~= "addr" then error("listen: unknown option '" .. tostring(k) .. "' (known: addr)", 2) end
  end
  local addr = opts.addr or "127.0.0.1:0"
  if type(addr) ~= "string" or not split_addr(addr) then
    error("listen: addr wants a numeric HOST:PORT like '0.0.0.0:7100', got " .. tostring(addr), 2)
  end
  if not target then mesh.job_hosts() end -- the token, and the mesh that joined hosts go into
  if M.address then error("listen: already listening for joins on " .. M.address, 2) end
  local bound, err = core.listen(addr)
  if not bound then error(errors.new { kind = "connect", message = err }, 2) end
  M.address = bound
  ensure_ticking()
  log.log("info", "listening for joining hosts on " .. bound)
  return bound
end

--- Runs fn(agent) as a task each time a host agent joins this HostMesh (by
-- the join port or refresh), once it is connected and is the mesh's last
-- host (agent.index). Grow meshes onto it with ProcMesh:grow{agent}. An
-- error in fn stops the script. Returns the HostMesh.
function HostMesh:on_join(fn)
  if type(fn) ~= "function" then error("on_join wants a function", 2) end
  self._on_join = self._on_join or {}
  self._on_join[#self._on_join + 1] = fn
  ensure_ticking()
  return self
end

-- The HOST:PORT lines of a hostfile, as monarch-run reads them (# starts a comment).
local function read_hostfile(path)
  local f, err = io.open(path, "r")
  if not f then error("refresh: cannot read the hostfile: " .. tostring(err), 3) end
  local out, n = {}, 0
  for line in f:lines() do
    n = n + 1
    local s = line:gsub("#.*$", ""):match("^%s*(.-)%s*$")
    if s ~= "" then
      if not s:match("^[^%s,]+:%d+$") then
        f:close()
        error(string.format("refresh: %s:%d: '%s' is not HOST:PORT", path, n, s), 3)
      end
      out[#out + 1] = s
    end
  end
  f:close()
  return out
end

--- Reads the hostfile again (path, or monarch-run's --hostfile) and
-- connects to the agents on lines this mesh does not have yet: the way to
-- add hosts to a job started with --hostfile. Blocks until they answer (up
-- to 10 s; one that takes longer joins when it does). Returns the list of
-- agents that joined (on_join handlers run for them too); an unreachable
-- line is logged and tried again by the next refresh. Lines that are gone
-- remove nothing.
function HostMesh:refresh(path)
  path = path or mesh.job_config().hostfile
  if type(path) ~= "string" then error("refresh: this job has no hostfile (monarch-run --hostfile FILE, or pass a path)", 2) end
  local fresh = {}
  for _, addr in ipairs(read_hostfile(path)) do
    local a, new = add(self, addr, "hostfile")
    if new then fresh[#fresh + 1] = a end
  end
  ensure_ticking()
  -- One still connecting after that joins later, by itself (on_join tells).
  pcall(procs_mod.wait_until, function()
    for _, a in ipairs(fresh) do if connecting[a] then return false end end
    return true
  end, procs_mod.CONNECT_TIMEOUT, "connecting to the hostfile's new hosts")
  local joined = {}
  for _, a in ipairs(fresh) do
    if a.index and self.agents[a.index + 1] == a then joined[#joined + 1] = a end -- admitted, not a twin
  end
  return joined
end

-- ---- growing a ProcMesh --------------------------------------------------------------

-- Every entry of what(p) that all of procs have (handlers registered on the whole mesh), in procs[1]'s order.
local function common(procs, what)
  local count = {}
  for _, p in ipairs(procs) do
    local seen = {}
    for _, x in ipairs(what(p) or {}) do
      if not seen[x] then
        seen[x] = true
        count[x] = (count[x] or 0) + 1
      end
    end
  end
  local out = {}
  for _, x in ipairs(what(procs[1]) or {}) do
    if count[x] == #procs then
      out[#out + 1] = x
      count[x] = nil
    end
  end
  return out
end

local function check_agents(agents, level)
  if getmetatable(agents) == HostMesh then agents = agents.agents end
  if type(agents) ~= "table" or #agents == 0 then
    error("grow wants a list of host agents (those on_join gives) or a HostMesh", level + 1)
  end
  for i, a in ipairs(agents) do
    if type(a) ~= "table" or a.conn == nil then error("grow: entry " .. i .. " is not a host agent", level + 1) end
    if a.state ~= "ready" then
      error(errors.new { kind = "connect", host = a.addr, message = "grow: host agent is " .. tostring(a.state) }, level + 1)
    end
  end
  return agents
end

local methods = {}

--- Spawns this mesh's procs per host on each of `agents` (a list of host
-- agents, as on_join and HostMesh:refresh give them, or a HostMesh) and
-- returns two meshes: this one grown by those hosts along its "hosts"
-- dimension (the old procs keep their coordinates), and the new procs
-- alone. The new procs have this mesh's kernel libraries loaded, its
-- options, and the on_failure and on_restart handlers all its procs have;
-- their ranks follow the mesh's highest, and their world is the grown
-- mesh's size. They hold none of its tensors: t:copy_from_peer(grown)
-- gives them a healthy proc's copy. Blocks until the procs are ready.
function methods:grow(agents)
  agents = check_agents(agents, 2)
  local names, sizes = self.shape.names, self.shape.sizes
  if names[1] ~= "hosts" or #names < 2 then
    error("grow needs a mesh whose first dimension is 'hosts' (as spawn_procs makes it), not " .. tostring(self.shape), 2)
  end
  local per_host = #self:proc_list() / sizes[1]
  local spec, top = {}, -1
  for i = 2, #names do spec[#spec + 1] = { names[i], sizes[i] } end
  for _, p in ipairs(self:proc_list()) do top = math.max(top, p.rank) end
  if self:proc_list()[1].device ~= nil then spec.gpus = per_host end
  local world = #self:proc_list() + per_host * #agents
  local like = {}
  for _, p in ipairs(self:proc_list()) do like[#like + 1] = p.agent end
  local added = mesh.host_mesh(agents):spawn_procs(spec, { rank_base = top + 1, world = world, like = like })
  local libs = common(self:proc_list(), function(p) return p.libs end)
  for _, lib in ipairs(libs) do added:load(lib) end
  local listeners = common(self:proc_list(), function(p) return p.listeners end)
  local hooks = common(self:proc_list(), function(p) return p.init_hooks end)
  local all = {}
  for i, p in ipairs(self:proc_list()) do all[i] = p end
  local restart = true -- as for the handlers: what every old proc has
  for _, p in ipairs(self:proc_list()) do restart = restart and p.restart == true end
  for _, p in ipairs(added:proc_list()) do
    p.restart = restart or nil
    if #listeners > 0 then p.listeners = { unpack(listeners) } end
    if #hooks > 0 then p.init_hooks = { unpack(hooks) } end
    all[#all + 1] = p
  end
  local grown_sizes = { unpack(sizes) }
  grown_sizes[1] = sizes[1] + #agents
  local grown = mesh.proc_mesh(all, shape_mod.new(names, grown_sizes), self._opts, { unpack(libs) })
  return grown, mesh.proc_mesh(added:proc_list(), added.shape, self._opts, { unpack(libs) })
end

mesh.provide("monarch.join", methods)
return M
