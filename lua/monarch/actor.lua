--- Actors: Lua objects that live on the procs, with state kept between calls.
--   local env = procs:spawn("env", "rl.cartpole_env", { envs = 32 })
--   env:call("reset"):get()                 -- every actor; a ValueMesh
--   env:slice{ procs = 1 }:call_one("step", a):get()
--   env:choose("rollout", params):get()     -- the least busy one
--
-- An actor module is a Lua file that returns a table with new(args, ctx);
-- new returns the actor (usually setmetatable({...}, M)) and every other
-- function reachable from it whose name does not start with "_" is an
-- endpoint: M.step(self, ...). See docs/actors.md.
--
-- Code sync: the controller reads the module file, names its source by a
-- content hash, and sends the source (__actor_define) to a proc only the
-- first time that proc's connection needs that hash; the spawn itself
-- (__actor_spawn) carries only the hash. Calls to one proc run in order, so
-- the define and the spawn go out together without a round trip between.
local ffi = require "ffi"
local errors = require "monarch.errors"
local mesh = require "monarch.mesh"
local runtime = require "monarch.runtime"
local shape_mod = require "monarch.shape"

local M = {}
local ProcMesh = mesh.ProcMesh

local MAX_NAME = 200 -- longest actor name (the proc enforces the same)
local counters = { sources_sent = 0, bytes_sent = 0, spawns = 0 }

-- ---- modules and their hashes ------------------------------------------------------

--- The content hash the procs cache a module's source under: FNV-1a over 64
-- bits plus the length (the proc recomputes it to check what it received).
function M.content_hash(s)
  local h = ffi.new("uint64_t", 0xcbf29ce484222325ULL)
  local prime = 0x100000001b3ULL
  for i = 1, #s do h = bit.bxor(h, s:byte(i)) * prime end
  return "fnv1a64-" .. bit.tohex(h) .. "-" .. #s
end

local function read_all(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  local s = f:read("*a")
  f:close()
  return s
end

--[[ Resolves what spawn was given into { name, path, source, chunkname, hash }:
  a module name ("rl.cartpole_env", found with package.searchpath on package.path),
  a file path (contains "/" or ends in ".lua"), or { source = "...", name = "x" }.
  Syntax errors are found here, before anything is sent. ]]
function M.resolve(module, level)
  level = (level or 1) + 1
  local name, path, source
  if type(module) == "table" and type(module.source) == "string" then
    name = module.name or "inline"
    source = module.source
  elseif type(module) == "string" and module ~= "" then
    name = module
    if module:find("/", 1, true) or module:match("%.lua$") then
      path = module
    else
      local found, where = package.searchpath(module, package.path)
      if not found then
        error(errors.new { kind = "actor", message = "actor module '" .. module .. "' not found:" .. where }, level)
      end
      path = found
    end
    local err
    source, err = read_all(path)
    if not source then
      error(errors.new { kind = "actor", message = "cannot read actor module '" .. module .. "': " .. tostring(err) }, level)
    end
  else
    error("spawn wants a module name, a .lua path or {source = ...}, got " .. type(module), level)
  end
  local chunkname = path and ("@" .. path) or ("=" .. name)
  local ok, err = loadstring(source, chunkname)
  if not ok then
    error(errors.new { kind = "actor", message = "actor module '" .. name .. "' does not compile: " .. tostring(err) }, level)
  end
  return { name = name, path = path, source = source, chunkname = chunkname, hash = M.content_hash(source) }
end

-- The hashes proc p's current connection has been sent. A proc that is
-- replaced (a restart) comes back on a new connection with an empty cache.
local function sent_to(p)
  local c = p._actor_code
  if not c or c.conn ~= p.conn then
    c = { conn = p.conn, hashes = {} }
    p._actor_code = c
  end
  return c.hashes
end

-- Sends the source of mod to the procs of `procs` whose connection lacks it;
-- returns a Future (or nil when nobody needed it). The runtime routes it like
-- any call: a proc coming back from a restart gets it once it is back, a dead
-- one fails it (and the spawn behind it).
local function sync(procs, mod)
  local need = {}
  for _, p in ipairs(procs) do
    if not sent_to(p)[mod.hash] then need[#need + 1] = p end
  end
  if #need == 0 then return nil end
  for _, p in ipairs(need) do sent_to(p)[mod.hash] = true end
  counters.sources_sent = counters.sources_sent + #need
  counters.bytes_sent = counters.bytes_sent + #need * #mod.source
  local rec = runtime.submit(need, "__actor_define", { mod.hash, mod.source, mod.chunkname }, 3,
    { mode = "mesh", what = "code sync of '" .. mod.name .. "'", make_result = function() return true end })
  rec.future:on_done(function(f)
    if f.state == "error" then -- forget, so a later spawn sends it again
      for _, p in ipairs(need) do sent_to(p)[mod.hash] = nil end
    end
  end)
  return rec.future
end

-- ---- errors --------------------------------------------------------------------------

-- Errors come back from the procs naming the built-in; name the actor and endpoint instead.
local function annotate(err, name, endpoint)
  if not errors.is(err) then return err end
  for _, e in ipairs(err.failures or { err }) do
    if errors.is(e) and (e.kernel == nil or e.kernel:sub(1, 8) == "__actor_") then
      e.kernel = name .. "." .. tostring(endpoint)
      e.actor, e.endpoint = name, endpoint
      if type(e.message) == "string" then
        e.traceback = e.message:match("\nstack traceback:\n(.*)$")
      end
    end
  end
  return err
end

local function annotated(fut, name, endpoint)
  fut:on_done(function(f)
    if f.state == "error" then annotate(f.err, name, endpoint) end
  end)
  return fut
end

-- ---- ActorMesh -----------------------------------------------------------------------

local ActorMesh = {}
ActorMesh.__index = ActorMesh

local function new_actor_mesh(procmesh, name, mod, args, deps, spawned)
  return setmetatable({ _mesh = procmesh, name = name, module = mod, _args = args, _deps = deps,
    _spawned = spawned }, ActorMesh)
end

-- Meshes are handles to connections of this controller: they cannot travel.
local function check_args(level, ...)
  for i = 1, select("#", ...) do
    local v = select(i, ...)
    local mt = type(v) == "table" and getmetatable(v)
    if mt and (mt == ActorMesh or mt == ProcMesh) then
      error(string.format("argument %d: a%s cannot be sent to an actor; send plain data and make the call " ..
        "from the controller (docs/actors.md, 'Calling other meshes')", i, mt == ActorMesh and "n ActorMesh" or " ProcMesh"),
        level + 1)
    end
  end
end

local function check_endpoint(endpoint, level)
  if type(endpoint) ~= "string" or endpoint == "" then
    error("endpoint name must be a non-empty string, got " .. type(endpoint), level + 1)
  end
  if endpoint == "new" or endpoint:sub(1, 1) == "_" then
    error("'" .. endpoint .. "' is not an endpoint (new and names starting with _ are not callable)", level + 1)
  end
end

-- Spawns on the procs of `procs` (a list); returns a Future of the ValueMesh.
local function spawn_on(self_mesh, procs, name, mod, args, deps, spawned)
  local futs = {}
  futs[#futs + 1] = sync(procs, mod)
  local dep_hashes = {}
  for modname, dep in pairs(deps) do
    futs[#futs + 1] = sync(procs, dep)
    dep_hashes[modname] = dep.hash
  end
  counters.spawns = counters.spawns + 1
  local rec = runtime.submit(procs, "__actor_spawn", { name, mod.hash, args, dep_hashes }, 4, {
    mode = "mesh", what = "spawn of actor '" .. name .. "'", timeout = self_mesh._opts.timeout,
    make_result = function() return true end,
    -- Which connection (which incarnation of the proc) the actor lives on, for respawn().
    on_slot = function(slot, ok)
      if ok then spawned[procs[slot]] = procs[slot].conn end
    end,
  })
  futs[#futs + 1] = annotated(rec.future, name, "new")
  return futs
end

-- ---- restarts -------------------------------------------------------------------------

local wait_all -- below

-- What a restarted proc must run again: the actors spawned on it, by name.
-- One hook per proc record spawns them all when the mesh restarts it
-- (ProcMesh:on_restart; the hook runs in a task before the calls that
-- waited for the proc are sent, so those calls find their actor).
local function remember(procs, name, entry)
  local fresh = {}
  for _, p in ipairs(procs) do
    p._actors = p._actors or {}
    p._actors[name] = entry
    if not p._actor_hooked then
      p._actor_hooked = true
      fresh[#fresh + 1] = p
    end
  end
  if #fresh > 0 and ProcMesh.on_restart then
    mesh.proc_mesh(fresh, shape_mod.new({ "procs" }, { #fresh }), {}):on_restart(function(single)
      for _, p in ipairs(single._procs) do
        for aname, e in pairs(p._actors or {}) do
          e.spawned[p] = nil
          wait_all(spawn_on(single, { p }, aname, e.mod, e.args, e.deps, e.spawned), 1)
        end
      end
    end)
  end
end

local function forget(procs, name)
  for _, p in ipairs(procs) do
    if p._actors then p._actors[name] = nil end
  end
end

wait_all = function(futs, level)
  local first
  for _, f in ipairs(futs) do
    local ok, err = pcall(f.get, f)
    if not ok and not first then first = err end
  end
  if first then error(first, level + 1) end
end

--- Spawns one actor named `name` on every proc of this mesh, from `module`
-- (a module name found on package.path, a .lua path, or {source=, name=}),
-- calling its new(args, ctx) there. opts.deps: module names shipped with it
-- that the actor may require. Waits until every constructor has run; raises
-- the first failure with the proc's traceback. Returns an ActorMesh.
function ProcMesh:spawn(name, module, args, opts)
  if type(name) ~= "string" or name == "" or #name > MAX_NAME then
    error("spawn: the actor name must be a string of 1.." .. MAX_NAME .. " bytes", 2)
  end
  if args ~= nil and type(args) ~= "table" then error("spawn: args must be a table (or nil)", 2) end
  check_args(2, args)
  opts = opts or {}
  local mod = M.resolve(module, 2)
  local deps = {}
  for _, d in ipairs(opts.deps or {}) do deps[d] = M.resolve(d, 2) end
  local spawned = {}
  wait_all(spawn_on(self, self._procs, name, mod, args or {}, deps, spawned), 2)
  remember(self._procs, name, { mod = mod, args = args or {}, deps = deps, spawned = spawned })
  return new_actor_mesh(self, name, mod, args or {}, deps, spawned)
end

--- Number of actors (procs), or the size of one dimension.
function ActorMesh:size(dim) return self._mesh:size(dim) end

--- Sizes by dimension name.
function ActorMesh:sizes() return self._mesh:sizes() end

--- The ProcMesh the actors live on.
function ActorMesh:procs() return self._mesh end

--- The actors of a slice of the mesh (same spec as ProcMesh:slice).
function ActorMesh:slice(spec)
  local m = setmetatable({}, ActorMesh)
  for k, v in pairs(self) do m[k] = v end
  m._mesh = self._mesh:slice(spec)
  return m
end

--- A view whose calls use these options ({timeout = seconds}).
function ActorMesh:options(o)
  local m = setmetatable({}, ActorMesh)
  for k, v in pairs(self) do m[k] = v end
  m._mesh = self._mesh:options(o)
  return m
end

--- Calls endpoint(...) on every actor; returns a Future of a ValueMesh.
function ActorMesh:call(endpoint, ...)
  check_endpoint(endpoint, 2)
  check_args(2, ...)
  local n = select("#", ...)
  return annotated(self._mesh:_submit("__actor_call", { self.name, endpoint, ... }, n + 2,
    { what = "call '" .. self.name .. "." .. endpoint .. "'" }), self.name, endpoint)
end

--- Calls endpoint(...) on the one actor of this mesh; returns a Future of its value.
function ActorMesh:call_one(endpoint, ...)
  check_endpoint(endpoint, 2)
  check_args(2, ...)
  if self._mesh:size() ~= 1 then
    error("call_one needs a mesh of exactly one actor; this one has " .. self._mesh:size() .. " (slice it first)", 2)
  end
  return annotated(self._mesh:call_one("__actor_call", self.name, endpoint, ...), self.name, endpoint)
end

--- Calls endpoint(...) on one live actor, the least busy; returns a Future of its value.
function ActorMesh:choose(endpoint, ...)
  check_endpoint(endpoint, 2)
  check_args(2, ...)
  local ok, fut = pcall(self._mesh.choose, self._mesh, "__actor_call", self.name, endpoint, ...)
  if not ok then error(annotate(fut, self.name, endpoint), 2) end
  return annotated(fut, self.name, endpoint)
end

--- Calls endpoint(...) on every actor without waiting. A failure is raised
-- at the script's next wait, like ProcMesh:broadcast.
function ActorMesh:broadcast(endpoint, ...)
  check_endpoint(endpoint, 2)
  check_args(2, ...)
  local fut = self:call(endpoint, ...)
  fut:on_done(function(f)
    if f.state == "error" then
      f.observed = true
      runtime.unhandled(f.err)
    end
  end)
end

--- Calls endpoint(...) on every actor and iterates (coords, value) as results arrive.
function ActorMesh:stream(endpoint, ...)
  check_endpoint(endpoint, 2)
  check_args(2, ...)
  local it = self._mesh:stream("__actor_call", self.name, endpoint, ...)
  local name = self.name
  return function()
    local ok, c, v = pcall(it)
    if not ok then error(annotate(c, name, endpoint), 2) end
    return c, v
  end
end

--- Spawns the actor again on procs of this mesh that came back as new
-- processes (a restarted proc: ready, on another connection than the one
-- the actor was spawned on). Waits; returns how many were spawned.
function ActorMesh:respawn()
  local again = {}
  for _, p in ipairs(self._mesh._procs) do
    if p.state == "ready" and self._spawned[p] ~= p.conn then again[#again + 1] = p end
  end
  if #again == 0 then return 0 end
  wait_all(spawn_on(self._mesh, again, self.name, self.module, self._args, self._deps, self._spawned), 2)
  return #again
end

--- Stops the actors (their on_stop runs; tensors they made are freed).
-- Returns a Future of a ValueMesh of booleans (false where there was no such actor).
function ActorMesh:stop()
  forget(self._mesh._procs, self.name)
  return annotated(self._mesh:_submit("__actor_stop", { self.name }, 1, { what = "stop of actor '" .. self.name .. "'" }),
    self.name, "stop")
end

ActorMesh.__tostring = function(a)
  return string.format("ActorMesh '%s' (%s) on %s", a.name, a.module.name, tostring(a._mesh))
end

--- Counters of this controller: sources_sent (define messages), bytes_sent, spawns.
function M.stats()
  local out = {}
  for k, v in pairs(counters) do out[k] = v end
  return out
end

--- True if v is an ActorMesh.
function M.is(v) return getmetatable(v) == ActorMesh end

M.ActorMesh = ActorMesh
return M
