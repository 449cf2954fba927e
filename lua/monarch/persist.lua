--- Persistent named meshes: procs that outlive the controller that made
-- them, so a REPL can leave and another can pick them up.
--   procs:persist("work", { w = w })   -- keep these procs, and name tensor w
--   procs:detach()                     -- let go now; they keep running
--   local m = monarch.attach("work")   -- any controller on the same hosts:
--   m:call("sum", m.tensors.w)         -- same procs, kernels loaded, tensors there
--   m:stop()                           -- ends them
-- Each host agent involved keeps, under the name, this controller's
-- description of the mesh (shape, ranks, pids, ports, libraries, tensors)
-- and keeps the procs up, parked, while no controller holds them; each proc
-- is told (__persist) to wait for its next controller instead of exiting on
-- its orphan timeout. A controller that attaches opens a new session with
-- each proc: its kernel libraries and tensors belong to the process, not to
-- a session, so they are all still there. See docs/repl.md.
local core = require "monarch.core"
local errors = require "monarch.errors"
local log = require "monarch.log"
local runtime = require "monarch.runtime"
local procs_mod = require "monarch.procs"
local shape_mod = require "monarch.shape"
local mesh_mod = require "monarch.mesh"
local tensor = require "monarch.tensor"

local M = {}
local MSG = core.MSG
M.REPLY_TIMEOUT = 10  -- seconds for the host agents to answer
M.DETACH_TIMEOUT = 60 -- seconds detach waits for calls in flight
M.FORMAT = 1          -- version of the description the agents keep
local MAX_NAME = 256  -- the agents' MN_MAX_NAME

--- Meshes this controller holds as persistent, by name.
M.meshes = {}

local methods = {} -- the ProcMesh methods this module makes (mesh.METHODS lists them)
local waiting = {} -- agent conn -> { req -> reply record }
local next_req = 0

-- The host agents answer PERSIST, ATTACH, DETACH, LIST and STATUS with a
-- REPLY {REPLY, req, ok, value}; it completes the request ask() is waiting on.
runtime.on_message(MSG.REPLY, function(m, conn)
  local q = waiting[conn]
  local r = q and q[m[2]]
  if r then
    q[m[2]] = nil
    r.ok, r.value, r.done = m[3] == true, m[4], true
  end
end)

local function agent_name(a)
  return (a.hostname or a.addr or "?") .. ":" .. tostring(a.port)
end

--- Sends make(req, a) to the connected agent a without waiting; returns the
-- request {agent, req}, which gets done = true, ok and value when the REPLY
-- arrives. forget(r) stops waiting for it.
function M.request(a, make)
  next_req = next_req + 1
  local r = { agent = a, req = next_req, conn = a.conn }
  waiting[a.conn] = waiting[a.conn] or {}
  waiting[a.conn][r.req] = r
  core.send(a.conn, make(r.req, a))
  return r
end

function M.forget(r)
  if waiting[r.conn] then waiting[r.conn][r.req] = nil end
end

-- Sends make(req, a) to every agent in `agents`; returns their replies, in order
-- ({agent, ok, value} each). An agent that does not answer is an error.
local function ask(agents, make, what)
  local pend = {}
  for i, a in ipairs(agents) do
    if a.state ~= "ready" then
      error(errors.new { kind = "connect", host = agent_name(a), message = "host agent is not connected (" ..
        tostring(a.reason or a.state) .. ")" }, 0)
    end
    pend[i] = M.request(a, make)
  end
  local ok, err = pcall(procs_mod.wait_until, function()
    for _, r in ipairs(pend) do
      if not r.done and r.agent.state ~= "dead" then return false end
    end
    return true
  end, M.REPLY_TIMEOUT, what)
  for _, r in ipairs(pend) do M.forget(r) end
  if not ok then error(err, 0) end
  for _, r in ipairs(pend) do
    if not r.done then
      error(errors.new { kind = "connect", host = agent_name(r.agent), message = "host agent lost while " .. what ..
        ": " .. tostring(r.agent.reason) }, 0)
    end
  end
  return pend
end

local function check_name(name, level)
  if type(name) ~= "string" or #name == 0 or #name > MAX_NAME then
    error("a persistent mesh needs a name of 1.." .. MAX_NAME .. " bytes, got " .. tostring(name), level + 1)
  end
end

local LIVE = { ready = true, reconnecting = true }

-- ---- persist ---------------------------------------------------------------------

-- The description of mesh m that the agents keep for a later attach.
local function describe(m, name, named, meta)
  local names_of = {}
  for tname, t in pairs(named or {}) do
    if type(tname) ~= "string" or not tensor.is(t) then
      error("persist: the second argument maps names to tensors ({w = w}); entry " .. tostring(tname) .. " is not one", 3)
    end
    names_of[t.__mn_tensor] = tname
  end
  local specs, holders, ids = {}, {}, {}
  for _, p in ipairs(m:proc_list()) do
    for id, spec in pairs(p.tensors or {}) do
      if not specs[id] then
        specs[id], holders[id] = spec, {}
        ids[#ids + 1] = id
      end
      table.insert(holders[id], p.rank)
    end
  end
  for id, tname in pairs(names_of) do
    if not specs[id] then error("persist: tensor '" .. tname .. "' does not live on this mesh's procs", 3) end
  end
  table.sort(ids)
  local tensors = {}
  for i, id in ipairs(ids) do
    tensors[i] = { id = id, dtype = specs[id].dtype, shape = specs[id].shape, name = names_of[id],
      ranks = #holders[id] < #m:proc_list() and holders[id] or nil }
  end
  local procs = {}
  for i, p in ipairs(m:proc_list()) do
    procs[i] = { rank = p.rank, world = p.world, host = p.host, pid = p.pid, port = p.port, libs = p.libs or {},
      device = p.device }
  end
  return { format = M.FORMAT, name = name, names = m.shape.names, sizes = m.shape.sizes, procs = procs,
    tensors = tensors, libs = m._libs, created = os.time(), meta = meta }
end

--- Keeps this mesh's procs running after this controller leaves, under
-- `name` (unique on each host), for monarch.attach(name) in another
-- controller connected to the same host agents. `tensors` ({name = tensor})
-- names tensors to find again as attached_mesh.tensors.name (every tensor
-- the procs hold is recorded, by id; named ones are also kept from the
-- garbage collector here). Needs long-lived host agents (--hosts), not the
-- one monarch-run starts for itself. `meta`, a table of plain values, is
-- kept with the description and comes back as attached_mesh.meta (the
-- training library keeps its job's identity there). Returns the mesh.
function methods:persist(name, tensors, meta)
  check_name(name, 2)
  if tensors ~= nil and type(tensors) ~= "table" then
    error("persist: the second argument maps names to tensors ({w = w})", 2)
  end
  for _, p in ipairs(self:proc_list()) do
    if not LIVE[p.state] then
      error(errors.new { kind = "persist", rank = p.rank, host = p.host, pid = p.pid,
        message = "cannot persist a proc that is " .. tostring(p.state) }, 2)
    end
  end
  if meta ~= nil and type(meta) ~= "table" then error("persist: the third argument (meta) must be a table", 2) end
  local desc = describe(self, name, tensors, meta)
  local pids, agents = {}, {}
  for _, p in ipairs(self:proc_list()) do
    if not pids[p.agent] then
      pids[p.agent] = {}
      agents[#agents + 1] = p.agent
    end
    table.insert(pids[p.agent], p.pid)
  end
  local replies = ask(agents, function(req, a) return { MSG.PERSIST, req, name, pids[a], desc } end,
    "persisting mesh '" .. name .. "'")
  for _, r in ipairs(replies) do
    if not r.ok then
      error(errors.new { kind = "persist", host = agent_name(r.agent), message = tostring(r.value) }, 2)
    end
  end
  -- Now the procs themselves: no orphan timeout from here on.
  local ok, err = pcall(function() return self:_submit("__persist", { true }, 1, { what = "persist" }):get() end)
  if not ok then error(err, 2) end
  for _, p in ipairs(self:proc_list()) do p.persistent = name end
  self._persistent, self._named = name, tensors
  M.meshes[name] = self
  return self
end

-- ---- detach ----------------------------------------------------------------------

--- Lets go of this persistent mesh now: waits for the calls in flight, tells
-- the host agents, and closes the connections. The procs keep running for
-- monarch.attach(name); in this controller the mesh is stopped (its calls
-- fail). Exiting the REPL or the script does the same to every persistent
-- mesh still held.
function methods:detach()
  local name = self._persistent
  if not name then
    error("detach: this mesh is not persistent (mesh:persist(name) first; mesh:stop() ends it)", 2)
  end
  procs_mod.wait_until(function()
    for _, p in ipairs(self:proc_list()) do
      if LIVE[p.state] and p.conn and core.inflight(p.conn) > 0 then return false end
    end
    return true
  end, M.DETACH_TIMEOUT, "waiting for the calls in flight before detaching '" .. name .. "'")
  local agents, seen = {}, {}
  for _, p in ipairs(self:proc_list()) do
    if LIVE[p.state] and not seen[p.agent] then
      seen[p.agent] = true
      agents[#agents + 1] = p.agent
    end
  end
  local replies = ask(agents, function(req) return { MSG.DETACH, req, name } end, "detaching '" .. name .. "'")
  for _, r in ipairs(replies) do
    if not r.ok then error(errors.new { kind = "persist", host = agent_name(r.agent), message = tostring(r.value) }, 2) end
  end
  for _, p in ipairs(self:proc_list()) do
    if LIVE[p.state] then
      -- "stopped" for this controller: calls fail at once, nothing frees its
      -- tensors, stop() leaves it alone. Events of the old connection are stale.
      local conn = p.conn
      procs_mod.set(p, "conn", nil)
      p.detached = true
      procs_mod.set(p, "state", "stopped")
      p.cause = "detached from this controller (monarch.attach('" .. name .. "') takes it back)"
      if p.agent.procs then p.agent.procs[p.pid] = nil end
      if conn then core.disconnect(conn, "detached") end
    end
  end
  M.meshes[name] = nil
end

-- ---- attach ----------------------------------------------------------------------

-- Whether an agent's ATTACH reply refuses because another connected controller holds the mesh there.
local function held_reply(r)
  return not r.ok and tostring(r.value):find("held by another controller", 1, true) ~= nil
end

-- A handle for tensor t.id, which already lives on m's procs: no
-- __tensor_new, and nothing freed when the handle is collected (the tensor
-- belongs to the persistent mesh). Later tensors of this controller must
-- not reuse the id, so the id counter of monarch.tensor moves past it.
local function adopt(m, t)
  return tensor.adopt(m, t.id, t.dtype, t.shape)
end

-- The agent holding the proc described by d: by pid, then by host name.
local function holder_of(d, found)
  local cands = {}
  for _, r in ipairs(found) do
    for _, pid in ipairs(r.value.pids or {}) do
      if pid == d.pid then cands[#cands + 1] = r.agent end
    end
  end
  if #cands <= 1 then return cands[1] end
  for _, a in ipairs(cands) do
    if a.hostname == d.host then return a end
  end
  return cands[1]
end

local function held(name)
  local m = M.meshes[name]
  if not m then return nil end
  for _, p in ipairs(m:proc_list()) do
    if LIVE[p.state] then return m end
  end
  M.meshes[name] = nil
end

--- Takes over the persistent mesh `name` from the host agents of this job
-- (monarch.hosts()): connects to its procs and returns a ProcMesh of them,
-- with their kernel libraries loaded and tensors in place. m.tensors holds
-- tensor handles by id and by the names given to persist. A proc that
-- exited while nobody held the mesh is "dead" in it (a warning says so).
-- Fails if no agent knows the name, or another connected controller holds it.
function M.attach(name)
  check_name(name, 2)
  local have = held(name)
  if have then return have end
  local agents = mesh_mod.job_hosts().agents
  local replies = ask(agents, function(req) return { MSG.ATTACH, req, name } end, "attaching '" .. name .. "'")
  local found, why, held, unknown = {}, {}, false, true
  for _, r in ipairs(replies) do
    if r.ok and type(r.value) == "table" and type(r.value.description) == "table" then
      found[#found + 1] = r
    else
      why[#why + 1] = agent_name(r.agent) .. ": " .. tostring(r.value)
      held = held or held_reply(r)
    end
    unknown = unknown and not r.ok and tostring(r.value):find("no persistent mesh named", 1, true) ~= nil
  end
  if held then found = {} end -- held on one host is held: taking the rest would split the mesh
  if #found == 0 then
    -- held: another connected controller holds it; unknown: no host keeps a mesh of that name.
    error(errors.new { kind = "attach", held = held, unknown = unknown and #replies > 0,
      message = "cannot attach '" .. name .. "':\n  " .. table.concat(why, "\n  ") }, 2)
  end
  local desc = found[1].value.description
  if desc.format ~= M.FORMAT or type(desc.procs) ~= "table" then
    error(errors.new { kind = "attach", message = "mesh '" .. name .. "' was described in format " ..
      tostring(desc.format) .. "; this controller reads format " .. M.FORMAT }, 2)
  end
  local procs, missing = {}, {}
  for i, d in ipairs(desc.procs) do
    local a = holder_of(d, found)
    local libs = {}
    for j, l in ipairs(d.libs or {}) do libs[j] = l end
    local p = { rank = d.rank, world = d.world, host = d.host, pid = d.pid, port = d.port, libs = libs, tensors = {},
      device = d.device, persistent = name, agent = a or found[1].agent }
    p.addr = p.agent.addr
    if a then
      procs_mod.set(p, "state", "connecting")
      a.procs[p.pid] = p
      procs_mod.connect(p)
    else
      procs_mod.set(p, "state", "dead")
      p.cause, p.missing = "exited while the mesh was detached", true
      missing[#missing + 1] = string.format("rank %d (pid %d on %s)", d.rank, d.pid, tostring(d.host))
    end
    procs[i] = p
  end
  local ok, err = pcall(procs_mod.wait_until, function()
    for _, p in ipairs(procs) do
      if p.state == "connecting" then return false end
    end
    return true
  end, procs_mod.SPAWN_TIMEOUT, "connecting to the procs of '" .. name .. "'")
  local failures = {}
  for _, p in ipairs(procs) do
    if p.state == "ready" then
      local _, _, pid = core.info(p.conn)
      if pid ~= p.pid then
        procs_mod.set(p, "state", "dead")
        p.cause = string.format("pid %s answers on port %d, not %d", tostring(pid), p.port, p.pid)
        core.disconnect(p.conn, p.cause)
      end
    end
    if p.state ~= "ready" and not p.missing then
      failures[#failures + 1] = string.format("rank %d on %s: %s", p.rank, tostring(p.host),
        tostring(p.cause or (not ok and err) or p.state))
    end
  end
  if #failures > 0 then
    error(errors.new { kind = "attach", message = "cannot reach " .. #failures .. " procs of '" .. name .. "':\n  " ..
      table.concat(failures, "\n  ") }, 2)
  end
  local m = mesh_mod.proc_mesh(procs, shape_mod.new(desc.names, desc.sizes), {}, desc.libs or {})
  m.tensors, m.meta = {}, desc.meta
  local by_rank = {}
  for _, p in ipairs(procs) do by_rank[p.rank] = p end
  for _, t in ipairs(desc.tensors or {}) do
    local on = m
    if t.ranks then
      local sub = {}
      for _, r in ipairs(t.ranks) do sub[#sub + 1] = by_rank[r] end
      on = mesh_mod.flat(sub, m._libs)
    end
    for _, p in ipairs(on:proc_list()) do p.tensors[t.id] = { dtype = t.dtype, shape = t.shape } end
    local h = adopt(on, t)
    m.tensors[t.id] = h
    if t.name then m.tensors[t.name] = h end
  end
  if #missing > 0 then
    log.log("warn", "mesh '" .. name .. "': " .. #missing .. " procs exited while it was detached: " ..
      table.concat(missing, ", "))
  end
  m._persistent = name
  M.meshes[name] = m
  return m
end

--- Whether another connected controller holds the persistent mesh `name` on any of this job's hosts now (for a
-- controller that was unreachable long enough for its agents to drop it, and a standby took over). Asks as attach
-- does, without connecting to the procs; a host that cannot be asked counts as not holding it.
function M.held_elsewhere(name)
  check_name(name, 2)
  local agents = {}
  for _, a in ipairs(mesh_mod.job_hosts().agents) do
    if a.state == "ready" then agents[#agents + 1] = a end
  end
  local ok, replies = pcall(ask, agents, function(req) return { MSG.ATTACH, req, name } end, "asking for '" .. name .. "'")
  if not ok then return false end
  for _, r in ipairs(replies) do
    if held_reply(r) then return true end
  end
  return false
end

--- The persistent meshes the host agents keep: {name = {procs = n, hosts = {...}}}.
function M.list()
  local agents = mesh_mod.job_hosts().agents
  local replies = ask(agents, function(req) return { MSG.LIST, req } end, "listing persistent meshes")
  local out = {}
  for _, r in ipairs(replies) do
    if r.ok and type(r.value) == "table" then
      for _, e in ipairs(r.value) do
        local x = out[e.name] or { procs = 0, hosts = {} }
        x.procs = x.procs + (e.procs or 0)
        x.hosts[#x.hosts + 1] = agent_name(r.agent)
        out[e.name] = x
      end
    end
  end
  return out
end

--- Sends make(req, agent) to every agent and returns their REPLYs in order
-- ({agent, ok, value} each); used by monarch.status too.
M.ask = ask

mesh_mod.provide("monarch.persist", methods)
return M
