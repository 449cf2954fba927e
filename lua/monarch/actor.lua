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
local future = require "monarch.future"
local mesh = require "monarch.mesh"
local runtime = require "monarch.runtime"
local value_mesh = require "monarch.value_mesh"
local unpack = unpack or table.unpack

local M = {}
local ProcMesh = mesh.ProcMesh
local methods = {} -- the ProcMesh methods this module makes (mesh.METHODS lists them)

local MAX_NAME = 200 -- longest actor name (the proc enforces the same)
local MAX_WALK = 16  -- deepest nesting of arguments searched for meshes (msgpack allows 14)
local MAX_RELAY_ARGS = 62 -- most arguments of a mesh call from an actor (MN_MAX_ARGS less the actor's two)
local counters = { sources_sent = 0, bytes_sent = 0, spawns = 0, relayed = 0 }
local next_ref = 0   -- ids of mesh handles, unique in this controller

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

local function new_actor_mesh(procmesh, name, mod, args, deps, spawned, refs)
  return setmetatable({ _mesh = procmesh, name = name, module = mod, _args = args, _deps = deps,
    _spawned = spawned, _refs = refs }, ActorMesh)
end

-- ---- meshes handed to actors ------------------------------------------------------------
--
-- A mesh is a handle to this controller's connections, so it cannot travel
-- itself: an actor gets {__mn_mesh = id, ...} instead, and the ActorMesh
-- keeps id -> mesh in its refs (shared by its slices, cleared by stop). An
-- endpoint that calls such a handle yields on its proc; the call comes back
-- as {__mn_yield = token, rank, request}, the controller makes the request
-- on the mesh and sends __actor_resume with the result.

local function new_refs() return { by_mesh = {}, by_id = {} } end

local function handle_of(refs, m)
  local id = refs.by_mesh[m]
  if not id then
    next_ref = next_ref + 1
    id = next_ref
    refs.by_mesh[m], refs.by_id[id] = id, m
  end
  local is_actor = getmetatable(m) == ActorMesh
  return { __mn_mesh = id, kind = is_actor and "actors" or "procs", size = m:size(), sizes = m:sizes(),
    actor = is_actor and m.name or nil }
end

-- v with every ProcMesh and ActorMesh in it (plain tables searched, copied
-- where they change) replaced by a handle registered in refs.
local function encode(refs, v, depth, path)
  if type(v) ~= "table" then return v end
  local mt = getmetatable(v)
  if mt == ActorMesh or mt == ProcMesh then return handle_of(refs, v) end
  if mt ~= nil or depth > MAX_WALK or path[v] then return v end
  path[v] = true
  local copy
  for k, x in pairs(v) do
    local y = encode(refs, x, depth + 1, path)
    if y ~= x then
      if not copy then
        copy = {}
        for k2, x2 in pairs(v) do copy[k2] = x2 end
      end
      copy[k] = y
    end
  end
  path[v] = nil
  return copy or v
end

-- Encodes the n values of args in place; returns args.
local function encode_args(refs, args, n)
  for i = 1, n do
    if type(args[i]) == "table" then args[i] = encode(refs, args[i], 1, {}) end
  end
  return args
end

-- What an actor sent in a request, for the mesh it calls: its handles back
-- to meshes, its tensor views ({__mn_view = id}) to tensor handles.
local function decode(refs, v, depth)
  if type(v) ~= "table" or depth > MAX_WALK then return v end
  if v.__mn_view ~= nil then return { __mn_tensor = v.__mn_view } end
  if v.__mn_mesh ~= nil then
    local m = refs.by_id[v.__mn_mesh]
    if not m then error("mesh handle " .. tostring(v.__mn_mesh) .. " was not handed to this actor", 0) end
    for _, spec in ipairs(v.slices or {}) do m = m:slice(spec) end
    return m
  end
  for k, x in pairs(v) do v[k] = decode(refs, x, depth + 1) end
  return v
end

local RELAY_VERBS = { call = true, call_one = true, choose = true, broadcast = true }

-- Makes the request an endpoint yielded with; returns a Future of the value
-- to hand back (a ValueMesh becomes the array of its values).
local function perform(refs, req)
  if type(req) ~= "table" or not RELAY_VERBS[req.verb] then
    error("a mesh request needs a verb among call, call_one, choose, broadcast", 0)
  end
  local m = refs.by_id[req.mesh]
  if not m then error("mesh handle " .. tostring(req.mesh) .. " was not handed to this actor", 0) end
  if type(req.slices) == "table" then
    for _, spec in ipairs(req.slices) do m = m:slice(spec) end
  end
  local nargs = tonumber(req.nargs) or 0
  if nargs < 0 or nargs > MAX_RELAY_ARGS or nargs ~= math.floor(nargs) then
    error(string.format("a mesh request has %s arguments; at most %d", tostring(req.nargs), MAX_RELAY_ARGS), 0)
  end
  local args = type(req.args) == "table" and req.args or {}
  for i = 1, nargs do args[i] = decode(refs, args[i], 1) end
  counters.relayed = counters.relayed + 1
  if req.verb == "broadcast" then
    m:broadcast(req.name, unpack(args, 1, nargs))
    local f = future.new("broadcast")
    f:resolve(nil)
    return f
  end
  return m[req.verb](m, req.name, unpack(args, 1, nargs))
end

-- An inner call's failure as a plain table the proc can receive.
local function error_value(e)
  if errors.is(e) then
    return { kind = e.kind, message = e.message, kernel = e.kernel, rank = e.rank, host = e.host, pid = e.pid,
      text = tostring(e) }
  end
  -- A usage error raised on the controller names a line of the library, not of the actor: drop it.
  local msg = tostring(e):gsub("^[^:\n]+%.lua:%d+: ", "")
  return { kind = "error", message = msg, text = msg }
end

local function is_yield(v) return type(v) == "table" and v.__mn_yield ~= nil and type(v.request) == "table" end

-- Follows one endpoint on proc p through its mesh calls: while its result
-- is a yield, makes the request and resumes it. done(ok, value) gets the
-- endpoint's real result or the failure of a resume.
local function follow(am, p, v, done)
  if not is_yield(v) then return done(true, v) end
  local token = v.__mn_yield
  local ok, inner = pcall(perform, am._refs, v.request)
  local function resume(rok, value)
    local rec = runtime.submit({ p }, "__actor_resume", { am.name, token, rok, value }, 4,
      { mode = "one", timeout = am._mesh._opts.timeout, what = "resume of '" .. am.name .. "'" })
    rec.future:on_done(function(f)
      if f.state == "error" then
        f.observed = true
        done(false, f.err)
      else
        follow(am, p, f.value, done)
      end
    end)
  end
  if not ok then return resume(false, error_value(inner)) end
  inner:on_done(function(f)
    f.observed = true
    if f.state == "error" then return resume(false, error_value(f.err)) end
    local value = f.value
    if value_mesh.is(value) then value = value:values() end
    resume(true, value)
  end)
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
    mesh.flat(fresh):on_restart(function(single)
      for _, p in ipairs(single:proc_list()) do
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
function methods:spawn(name, module, args, opts)
  if type(name) ~= "string" or name == "" or #name > MAX_NAME then
    error("spawn: the actor name must be a string of 1.." .. MAX_NAME .. " bytes", 2)
  end
  if args ~= nil and type(args) ~= "table" then error("spawn: args must be a table (or nil)", 2) end
  local refs = new_refs()
  args = encode(refs, args or {}, 1, {})
  opts = opts or {}
  local mod = M.resolve(module, 2)
  local deps = {}
  for _, d in ipairs(opts.deps or {}) do deps[d] = M.resolve(d, 2) end
  local spawned = {}
  wait_all(spawn_on(self, self:proc_list(), name, mod, args, deps, spawned), 2)
  remember(self:proc_list(), name, { mod = mod, args = args, deps = deps, spawned = spawned })
  return new_actor_mesh(self, name, mod, args, deps, spawned, refs)
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
  m._partial = true -- its stop must not drop the meshes the whole actor mesh was handed
  return m
end

--- A view whose calls use these options ({timeout = seconds}).
function ActorMesh:options(o)
  local m = setmetatable({}, ActorMesh)
  for k, v in pairs(self) do m[k] = v end
  m._mesh = self._mesh:options(o)
  return m
end

-- Sends __actor_call to every actor of self and follows each one through its
-- mesh calls. on_final(slot, ok, v), if given, sees each actor's final
-- outcome as it comes (stream). Returns a Future of a ValueMesh.
local function call_all(self, endpoint, n, on_final, ...)
  local procs, shape = self._mesh:proc_list(), self._mesh.shape
  local out = future.new("call '" .. self.name .. "." .. endpoint .. "'")
  local values, failures, left, reported = {}, nil, #procs, 0
  local function complete()
    if failures then
      -- The lowest rank first, as for a kernel call.
      table.sort(failures, function(a, b)
        return (type(a) == "table" and a.rank or math.huge) < (type(b) == "table" and b.rank or math.huge)
      end)
      local first = failures[1]
      if type(first) == "table" then
        first.others = #failures - 1
        first.failures = failures
      end
      out:fail(annotate(first, self.name, endpoint))
    else
      out:resolve(value_mesh.new(shape, values, #procs))
    end
  end
  local function final(slot, ok, v)
    if ok then
      values[slot] = v
    else
      failures = failures or {}
      failures[#failures + 1] = annotate(v, self.name, endpoint)
    end
    if on_final then on_final(slot, ok, v) end
    left = left - 1
    if left == 0 then complete() end
  end
  local base = self._mesh:_submit("__actor_call", encode_args(self._refs, { self.name, endpoint, ... }, n + 2), n + 2, {
    what = "call '" .. self.name .. "." .. endpoint .. "'",
    on_slot = function(slot, ok, v)
      reported = reported + 1
      if ok and is_yield(v) then
        follow(self, procs[slot], v, function(ok2, v2) final(slot, ok2, v2) end)
      else
        final(slot, ok, v)
      end
    end,
  })
  out.source = base -- out:cancel() stops the endpoints on their procs
  base:on_done(function(f)
    f.observed = true
    -- A call timeout fails the call without reporting the missing actors.
    if f.state == "error" and reported < #procs then out:fail(annotate(f.err, self.name, endpoint)) end
  end)
  if #procs == 0 then complete() end
  return out
end

-- Follows the one actor that answered base (a Future of one value) through
-- its mesh calls; returns a Future of its final value.
local function follow_one(self, endpoint, base)
  local out = future.new("call '" .. self.name .. "." .. endpoint .. "'")
  out.source = base -- out:cancel() stops the endpoint on its proc
  base:on_done(function(f)
    f.observed = true
    if f.state == "error" then return out:fail(annotate(f.err, self.name, endpoint)) end
    if not is_yield(f.value) then return out:resolve(f.value) end
    local p
    for _, q in ipairs(self._mesh:proc_list()) do
      if q.rank == f.value.rank then p = q end
    end
    if not p then
      return out:fail(errors.new { kind = "actor", kernel = self.name .. "." .. endpoint,
        message = "a mesh call came from rank " .. tostring(f.value.rank) .. ", which is not in this mesh" })
    end
    follow(self, p, f.value, function(ok, v)
      if ok then out:resolve(v) else out:fail(annotate(v, self.name, endpoint)) end
    end)
  end)
  return out
end

--- Calls endpoint(...) on every actor; returns a Future of a ValueMesh.
-- Arguments may hold ProcMeshes and ActorMeshes: the actors can call them.
function ActorMesh:call(endpoint, ...)
  check_endpoint(endpoint, 2)
  return call_all(self, endpoint, select("#", ...), nil, ...)
end

--- Calls endpoint(...) on the one actor of this mesh; returns a Future of its value.
function ActorMesh:call_one(endpoint, ...)
  check_endpoint(endpoint, 2)
  if self._mesh:size() ~= 1 then
    error("call_one needs a mesh of exactly one actor; this one has " .. self._mesh:size() .. " (slice it first)", 2)
  end
  local n = select("#", ...)
  local args = encode_args(self._refs, { self.name, endpoint, ... }, n + 2)
  return follow_one(self, endpoint, self._mesh:call_one("__actor_call", unpack(args, 1, n + 2)))
end

--- Calls endpoint(...) on one live actor, the least busy; returns a Future of its value.
function ActorMesh:choose(endpoint, ...)
  check_endpoint(endpoint, 2)
  local n = select("#", ...)
  local args = encode_args(self._refs, { self.name, endpoint, ... }, n + 2)
  local ok, fut = pcall(self._mesh.choose, self._mesh, "__actor_call", unpack(args, 1, n + 2))
  if not ok then error(annotate(fut, self.name, endpoint), 2) end
  return follow_one(self, endpoint, fut)
end

--- Calls endpoint(...) on every actor without waiting. A failure is raised
-- at the script's next wait, like ProcMesh:broadcast.
function ActorMesh:broadcast(endpoint, ...)
  check_endpoint(endpoint, 2)
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
  local args, nargs = { ... }, select("#", ...)
  return mesh.stream_results(self._mesh.shape, self._mesh:size(), function(on_slot)
    return call_all(self, endpoint, nargs, on_slot, unpack(args, 1, nargs))
  end)
end

--- Spawns the actor again on procs of this mesh that came back as new
-- processes (a restarted proc: ready, on another connection than the one
-- the actor was spawned on). Waits; returns how many were spawned.
function ActorMesh:respawn()
  local again = {}
  for _, p in ipairs(self._mesh:proc_list()) do
    if p.state == "ready" and self._spawned[p] ~= p.conn then again[#again + 1] = p end
  end
  if #again == 0 then return 0 end
  wait_all(spawn_on(self._mesh, again, self.name, self.module, self._args, self._deps, self._spawned), 2)
  return #again
end

--- Stops the actors (their on_stop runs; tensors they made are freed).
-- Returns a Future of a ValueMesh of booleans (false where there was no such actor).
function ActorMesh:stop()
  forget(self._mesh:proc_list(), self.name)
  -- The meshes it was handed are no longer reachable from it.
  if self._refs and not self._partial then
    for k in pairs(self._refs.by_mesh) do self._refs.by_mesh[k] = nil end
    for k in pairs(self._refs.by_id) do self._refs.by_id[k] = nil end
  end
  return annotated(self._mesh:_submit("__actor_stop", { self.name }, 1, { what = "stop of actor '" .. self.name .. "'" }),
    self.name, "stop")
end

ActorMesh.__tostring = function(a)
  return string.format("ActorMesh '%s' (%s) on %s", a.name, a.module.name, tostring(a._mesh))
end

--- Counters of this controller: sources_sent (define messages), bytes_sent, spawns,
-- relayed (mesh calls made for actors).
function M.stats()
  local out = {}
  for k, v in pairs(counters) do out[k] = v end
  return out
end

--- True if v is an ActorMesh.
function M.is(v) return getmetatable(v) == ActorMesh end

M.ActorMesh = ActorMesh
mesh.provide("monarch.actor", methods)
return M
