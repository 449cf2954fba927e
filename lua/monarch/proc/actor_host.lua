--- The actor host: runs inside a proc, in the LuaJIT state that
-- host/worker/actor.c makes on the proc's executor thread. It is never loaded
-- on the controller. actor.c runs this file once with
--   native: C functions (kcall, tensor_info, tensor_new, tensor_free, memory, cancelled)
--   info:   { rank, world, host, pid } of this proc
-- and keeps the table it returns: one function per __actor_* built-in, plus
-- traceback (the handler every call runs under), view (tensor handles in
-- arguments) and close_all.
--
-- Errors: a usage error (unknown actor, missing module) is raised as a table
-- {kind, message} and reported without a traceback; any other error is an
-- error in actor code and comes back with the Lua traceback of the proc.
local native, info = ...
local ffi = require "ffi"

local H = {}
local sources = {}   -- hash -> { source = s, chunkname = "@path" }
local compiled = {}  -- hash -> the module's main function
local actors = {}    -- name -> { inst, hash, proc, tensors = { [id] = true } }
local suspended = {} -- token -> { co, name, endpoint, rec }: endpoints waiting on a mesh call
local nsuspended, next_token = 0, 0
local running = nil  -- the entry whose coroutine runs now (mesh calls must come from it)
local stopped = {}   -- name -> true, once stopped (for a clearer message)
local stats = { defines = 0, spawns = 0, calls = 0, stops = 0, errors = 0 }

local MAX_NAME = 200  -- longest actor name
local MAX_SUSPENDED = 4096 -- most endpoints of one proc waiting on mesh calls at once
local MAX_WALK = 16   -- deepest nesting searched for mesh handles and tensor views
local USAGE = {}      -- metatable of usage errors
local TRACED = {}     -- metatable of errors that already carry their traceback

-- The state is the proc's: one actor must not end the process for everyone.
os.exit = function()
  error("os.exit is not available to actors: it would end the proc (raise an error instead)", 2)
end

local function fail(message, kind)
  error(setmetatable({ kind = kind or "actor", message = message }, USAGE), 0)
end

-- ---- errors ------------------------------------------------------------------------

-- Raises again what an inner xpcall(..., H.traceback) caught, without a second traceback.
local function rethrow(e)
  if getmetatable(e) == USAGE then error(e, 0) end
  error(setmetatable({ text = e }, TRACED), 0)
end

-- Frames that belong to the host and not to the actor's code.
local function internal(line)
  return line:find("monarch/proc/actor_host.lua", 1, true) or line:find("[C]: in function 'xpcall'", 1, true)
    or line:find("^%s*%[C%]: %?$") or line:find("^%s*%[C%]: at 0x") or line:find("^%s*%(tail call%)")
    or line:find("^%s*%[builtin#%d+%]") -- xpcall, as the coroutine of an endpoint shows it
end

--- The handler every operation runs under: keeps usage errors as they are and
-- gives any other error the traceback of the actor code that raised it.
function H.traceback(e)
  if getmetatable(e) == USAGE then return e end
  if getmetatable(e) == TRACED then return e.text end
  stats.errors = stats.errors + 1
  local msg
  if type(e) == "string" then msg = e
  elseif type(e) == "table" and getmetatable(e) and getmetatable(e).__tostring then msg = tostring(e)
  else msg = "error object is a " .. type(e) .. " (" .. tostring(e) .. ")" end
  local lines = {}
  for line in debug.traceback("", 2):gmatch("[^\n]+") do
    if line ~= "stack traceback:" and not internal(line) then lines[#lines + 1] = line end
  end
  if #lines == 0 then return msg end
  return msg .. "\nstack traceback:\n" .. table.concat(lines, "\n")
end

-- ---- tensors -----------------------------------------------------------------------

local CTYPES = { f32 = "float*", f64 = "double*", f16 = "uint16_t*", bf16 = "uint16_t*",
  i32 = "int32_t*", i64 = "int64_t*", u8 = "uint8_t*" }

local View = {}
View.__index = View
View.__tostring = function(v)
  return string.format("TensorView(%s, %s, {%s})", tostring(v.id), v.dtype, table.concat(v.shape, ","))
end

--- The elements as a Lua array (numbers).
function View:totable()
  local out, d = {}, self.data
  for i = 0, self.numel - 1 do out[i + 1] = tonumber(d[i]) end
  return out
end

--- Sets every element to v.
function View:fill(v)
  local d = self.data
  for i = 0, self.numel - 1 do d[i] = v end
  return self
end

--- A view of tensor `id` on this proc: data is a cdata pointer (0-based
-- indexing) valid while the tensor lives.
function H.view(id)
  local ptr, dtype, numel, nbytes, shape, device = native.tensor_info(id)
  if not ptr then fail("tensor " .. tostring(id) .. " does not exist on this proc (freed?)") end
  if device >= 0 then fail("tensor " .. tostring(id) .. " lives on a GPU; proc.tensor views CPU memory only") end
  return setmetatable({ __mn_tensor = id, id = id, dtype = dtype, numel = numel, nbytes = nbytes,
    shape = shape, ndim = #shape, data = ffi.cast(CTYPES[dtype], ptr) }, View)
end

-- ---- the proc table an actor sees ------------------------------------------------------

local function make_proc(name, rec)
  local proc = { rank = info.rank, world = info.world, host = info.host, pid = info.pid, actor = name }
  --- proc.call(kernel, ...): runs a kernel of this proc now and returns its results.
  proc.call = native.kcall
  --- proc.tensor(id or view): a view of a tensor this proc holds.
  function proc.tensor(t)
    if type(t) == "table" then t = t.__mn_tensor end
    if type(t) ~= "number" then error("proc.tensor wants a tensor id or view, got " .. type(t), 2) end
    return H.view(t)
  end
  --- proc.new_tensor(dtype, shape): a zeroed tensor owned by this actor (freed when it stops).
  function proc.new_tensor(dtype, shape)
    if type(shape) == "number" then shape = { shape } end
    if type(shape) ~= "table" then error("proc.new_tensor wants (dtype, {sizes...})", 2) end
    local id = native.tensor_new(dtype, shape)
    rec.tensors[id] = true
    return H.view(id)
  end
  --- proc.free_tensor(view): frees a tensor this actor made, now.
  function proc.free_tensor(v)
    local id = type(v) == "table" and v.__mn_tensor or v
    if not rec.tensors[id] then error("proc.free_tensor: tensor " .. tostring(id) .. " was not made by this actor", 2) end
    rec.tensors[id] = nil
    return native.tensor_free(id)
  end
  --- proc.memory(): bytes of Lua memory in use by this proc's actors, the peak, the limit.
  proc.memory = native.memory
  --- proc.cancelled(): true once the controller asked the running call to stop (long loops poll it).
  proc.cancelled = native.cancelled
  return proc
end

-- ---- references to other meshes ----------------------------------------------------------
--
-- The controller sends a mesh handed to an actor as a handle
-- {__mn_mesh = id, kind = "procs"|"actors", size, sizes, actor}. Here it
-- becomes a MeshRef whose verbs yield the endpoint's coroutine with a
-- request; __actor_call returns {__mn_yield = token, rank, request}, the
-- controller makes the call and sends __actor_resume(name, token, ok, value).

local YIELD = {}      -- first value of a mesh call's yield: tells it from the endpoint's own yields
local MeshRef = {}
MeshRef.__index = MeshRef
MeshRef.__tostring = function(r)
  return string.format("MeshRef(%s%s, %s)", r.kind == "actors" and ("actors '" .. tostring(r.actor) .. "'") or "procs",
    r.slices and " sliced" or "", r.size and (tostring(r.size) .. " procs") or "size unknown")
end

-- An inner call's failure as the endpoint sees it: kind, message, kernel,
-- rank, host, pid of the MonarchError the controller got.
local MeshError = {}
MeshError.__index = MeshError
MeshError.__tostring = function(e)
  return "mesh call failed: " .. tostring(e.text or e.message)
end

-- Tensor views in a request travel as {__mn_view = id}: a view would arrive
-- on the controller as a bare id, which a kernel refuses as a tensor.
local function views_out(v, depth)
  if type(v) ~= "table" or depth > MAX_WALK then return v end
  local id = rawget(v, "__mn_tensor")
  if type(id) == "number" then return { __mn_view = id } end
  if getmetatable(v) == MeshRef then return v end
  local copy
  for k, x in pairs(v) do
    local y = views_out(x, depth + 1)
    if y ~= x then
      if not copy then
        copy = {}
        for k2, x2 in pairs(v) do copy[k2] = x2 end
      end
      copy[k] = y
    end
  end
  return copy or v
end

local function request(ref, verb, name, ...)
  local co = coroutine.running()
  if not running or running.co ~= co then
    error("a mesh can be called only from inside an endpoint (not from new, on_stop, or a coroutine the " ..
      "endpoint made)", 3)
  end
  if type(name) ~= "string" or name == "" then
    error(string.format("mesh %s: the %s name must be a non-empty string, got %s", verb,
      ref.kind == "actors" and "endpoint" or "kernel", type(name)), 3)
  end
  local n = select("#", ...)
  local args = { ... }
  for i = 1, n do args[i] = views_out(args[i], 1) end
  local ok, v = coroutine.yield(YIELD, { mesh = ref.__mn_mesh, slices = ref.slices, verb = verb, name = name,
    args = args, nargs = n })
  if not ok then
    if type(v) ~= "table" then v = { kind = "error", message = tostring(v) } end
    error(setmetatable(v, MeshError), 2)
  end
  return v
end

--- ref:call(name, ...): the kernel or endpoint on every proc of the mesh;
-- returns an array of the values, one per proc in rank order.
function MeshRef:call(name, ...) return request(self, "call", name, ...) end
--- ref:call_one(name, ...): on the one proc of the mesh (slice it first); returns its value.
function MeshRef:call_one(name, ...) return request(self, "call_one", name, ...) end
--- ref:choose(name, ...): on the least busy proc of the mesh; returns its value.
function MeshRef:choose(name, ...) return request(self, "choose", name, ...) end
--- ref:broadcast(name, ...): on every proc, without waiting for the results.
function MeshRef:broadcast(name, ...)
  request(self, "broadcast", name, ...)
end
--- ref:slice(spec): the same mesh, sliced on the controller when called.
function MeshRef:slice(spec)
  if type(spec) ~= "table" then error("slice wants a table like {procs = 0}", 2) end
  local r = setmetatable({}, MeshRef)
  for k, v in pairs(self) do r[k] = v end
  local slices = {}
  for i, s in ipairs(self.slices or {}) do slices[i] = s end
  slices[#slices + 1] = spec
  r.slices, r.size, r.sizes = slices, nil, nil
  return r
end
--- ref:size(): number of procs of the mesh as it was handed (nil once sliced).
function MeshRef:size() return self.size end

-- Gives every mesh handle in v (as it arrived from the controller) the MeshRef metatable.
local function refs_in(v, depth)
  if type(v) ~= "table" or depth > MAX_WALK or getmetatable(v) ~= nil then return end
  if rawget(v, "__mn_mesh") ~= nil then
    setmetatable(v, MeshRef)
    return
  end
  for _, x in pairs(v) do
    if type(x) == "table" then refs_in(x, depth + 1) end
  end
end

-- ---- modules ---------------------------------------------------------------------------

local function check_hash(hash)
  if type(hash) ~= "string" or hash == "" then fail("a module hash must be a non-empty string", "bad_args") end
end

-- FNV-1a over 64 bits, with the length: the same function as lua/monarch/actor.lua.
local function content_hash(s)
  local h = ffi.new("uint64_t", 0xcbf29ce484222325ULL)
  local prime = 0x100000001b3ULL
  for i = 1, #s do h = bit.bxor(h, s:byte(i)) * prime end
  return "fnv1a64-" .. bit.tohex(h) .. "-" .. #s
end
H.content_hash = content_hash

--- __actor_define(hash, source, chunkname): caches a module's source.
function H.define(hash, source, chunkname)
  check_hash(hash)
  if type(source) ~= "string" then fail("__actor_define takes (hash, source, chunkname)", "bad_args") end
  if content_hash(source) ~= hash then fail("module source does not match its hash " .. hash, "bad_args") end
  if not sources[hash] then
    sources[hash] = { source = source, chunkname = type(chunkname) == "string" and chunkname or "=actor" }
    stats.defines = stats.defines + 1
  end
  return true
end

--- __actor_has(hash): true if the source with this hash is cached here.
function H.has(hash) return sources[hash] ~= nil end

local function module_fn(hash)
  local fn = compiled[hash]
  if fn then return fn end
  local src = sources[hash]
  if not src then fail("module " .. tostring(hash) .. " was never defined on this proc (send __actor_define first)", "bad_args") end
  local f, err = loadstring(src.source, src.chunkname)
  if not f then fail("cannot load the actor module: " .. tostring(err)) end
  compiled[hash] = f
  return f
end

-- Runs a module's main chunk in env; returns what it returns.
local function run_module(hash, env)
  local f = module_fn(hash)
  setfenv(f, env)
  return f()
end

-- The globals of one actor: its own table over the proc's, with `proc` and a
-- require that finds the modules shipped with it first.
local function make_env(proc, deps)
  local env = setmetatable({ proc = proc }, { __index = _G })
  env._G = env
  -- A proc's stdout is a pipe to its host agent, which forwards lines to the
  -- controller: flush, so that what an actor prints shows up when it prints it.
  env.print = function(...)
    print(...)
    io.stdout:flush()
  end
  local loaded = {}
  env.require = function(modname)
    if loaded[modname] ~= nil then return loaded[modname] end
    local hash = deps and deps[modname]
    if not hash then return require(modname) end
    loaded[modname] = true -- a cycle sees true, as with the stock require
    local v = run_module(hash, env)
    if v == nil then v = true end
    loaded[modname] = v
    return v
  end
  return env
end

-- The endpoints of an actor: functions reachable from the instance (through
-- __index tables) or, failing that, in its module table.
local function endpoint_names(inst, mod)
  local names, seen = {}, {}
  local function scan(t)
    local depth = 0
    while type(t) == "table" and depth < 8 do
      for k, v in pairs(t) do
        if type(k) == "string" and type(v) == "function" and k ~= "new" and k:sub(1, 1) ~= "_" and not seen[k] then
          seen[k] = true
          names[#names + 1] = k
        end
      end
      local mt = getmetatable(t)
      t = mt and type(mt.__index) == "table" and mt.__index or nil
      depth = depth + 1
    end
  end
  scan(inst)
  scan(mod)
  table.sort(names)
  return #names > 0 and table.concat(names, ", ") or "none"
end

--- __actor_spawn(name, hash, args, deps): runs the module and its constructor.
function H.spawn(name, hash, args, deps)
  if type(name) ~= "string" or name == "" or #name > MAX_NAME then
    fail("an actor name must be a string of 1.." .. MAX_NAME .. " bytes", "bad_args")
  end
  check_hash(hash)
  if actors[name] then fail("an actor named '" .. name .. "' already runs on this proc (stop it first)") end
  if deps ~= nil and type(deps) ~= "table" then fail("__actor_spawn: deps must be a table", "bad_args") end
  local rec = { hash = hash, tensors = {} }
  local proc = make_proc(name, rec)
  local env = make_env(proc, deps)
  local mod = run_module(hash, env)
  if type(mod) ~= "table" or type(mod.new) ~= "function" then
    fail(string.format("module %s must return a table with a new(args, ctx) function; it returned %s",
      (sources[hash].chunkname:gsub("^[@=]", "")), type(mod) == "table" and "a table without new" or type(mod)))
  end
  refs_in(args, 1)
  local ctx = { name = name, rank = info.rank, world = info.world, host = info.host, proc = proc }
  local ok, inst = xpcall(mod.new, H.traceback, args, ctx)
  if not ok or type(inst) ~= "table" then
    -- Whatever the constructor made dies with it.
    for id in pairs(rec.tensors) do native.tensor_free(id) end
    if not ok then rethrow(inst) end
    fail(string.format("%s: new() must return the actor's table, returned %s", name, type(inst)))
  end
  rec.inst, rec.mod, rec.proc = inst, mod, proc
  actors[name] = rec
  stopped[name] = nil
  stats.spawns = stats.spawns + 1
  return true
end

local function pack(...) return { n = select("#", ...), ... } end

-- Runs entry's coroutine until the endpoint finishes (returns its results)
-- or calls a mesh (returns the yield marker for the controller).
local function step(entry, ...)
  local prev = running
  running = entry
  local r = pack(coroutine.resume(entry.co, ...))
  running = prev
  if not r[1] then r = { n = 3, true, false, r[2] } end -- the handler itself failed
  if coroutine.status(entry.co) == "suspended" then
    if r[2] ~= YIELD then
      fail(string.format("endpoint '%s' of actor '%s' yielded outside a mesh call (an endpoint may not " ..
        "coroutine.yield itself; wrap such code in a coroutine of its own)", entry.endpoint, entry.name))
    end
    if nsuspended >= MAX_SUSPENDED then
      fail(string.format("more than MAX_SUSPENDED (%d) endpoints wait on mesh calls on this proc", MAX_SUSPENDED))
    end
    next_token = next_token + 1
    suspended[next_token] = entry
    nsuspended = nsuspended + 1
    return { __mn_yield = next_token, rank = info.rank, request = r[3] }
  end
  if not r[2] then
    -- xpcall runs no handler for a memory error: say what the limit is, as actor.c does outside coroutines.
    if r[3] == "not enough memory" then
      local used, _, limit = native.memory()
      fail(string.format("actor Lua state out of memory: %d MiB in use, limit %d MiB (set MONARCH_ACTOR_MEM_MB)",
        math.floor(used / 2 ^ 20), math.floor(limit / 2 ^ 20)))
    end
    rethrow(r[3])
  end
  return unpack(r, 3, r.n)
end

--- __actor_call(name, endpoint, ...): calls inst:endpoint(...) and returns its results.
function H.call(name, endpoint, ...)
  local rec = actors[name]
  if not rec then
    fail(stopped[name] and ("actor '" .. tostring(name) .. "' was stopped on this proc")
      or ("no actor named '" .. tostring(name) .. "' on this proc (spawn it first)"))
  end
  local inst = rec.inst
  local fn = type(endpoint) == "string" and endpoint ~= "new" and endpoint:sub(1, 1) ~= "_"
    and (inst[endpoint] or rec.mod[endpoint])
  if type(fn) ~= "function" then
    fail(string.format("actor '%s' has no endpoint '%s' (endpoints: %s)", name, tostring(endpoint),
      endpoint_names(inst, rec.mod)))
  end
  stats.calls = stats.calls + 1
  for i = 1, select("#", ...) do
    local a = select(i, ...)
    if type(a) == "table" then refs_in(a, 1) end
  end
  local entry = { name = name, endpoint = endpoint, rec = rec,
    co = coroutine.create(function(...) return xpcall(fn, H.traceback, ...) end) }
  return step(entry, inst, ...)
end

--- __actor_resume(name, token, ok, value): hands the result of a mesh call to
-- the endpoint waiting on it (ok false: value is the error, raised there).
-- Returns what __actor_call would: the endpoint's results, or another yield.
function H.resume(name, token, ok, value)
  local e = suspended[token]
  if not e then
    fail("no endpoint waits under token " .. tostring(token) .. " on this proc (it finished, or the proc was restarted)")
  end
  if e.name ~= name then
    fail(string.format("token %s belongs to actor '%s', not '%s'", tostring(token), e.name, tostring(name)), "bad_args")
  end
  suspended[token] = nil
  nsuspended = nsuspended - 1
  if actors[name] ~= e.rec then
    fail(string.format("actor '%s' was stopped while its endpoint '%s' waited on a mesh call", name, e.endpoint))
  end
  return step(e, ok == true, value)
end

local function stop_actor(name, rec)
  actors[name] = nil
  for token, e in pairs(suspended) do
    if e.rec == rec then
      suspended[token] = nil
      nsuspended = nsuspended - 1
    end
  end
  stopped[name] = true
  stats.stops = stats.stops + 1
  for id in pairs(rec.tensors) do native.tensor_free(id) end
  rec.tensors = {}
end

--- __actor_stop(name): runs the actor's optional on_stop, frees the tensors it
-- made and forgets it. Returns false if there was no such actor.
function H.stop(name)
  local rec = actors[name]
  if not rec then return false end
  local hook = rec.inst.on_stop
  if type(hook) == "function" then
    local ok, err = xpcall(hook, H.traceback, rec.inst)
    stop_actor(name, rec)
    if not ok then rethrow(err) end
  else
    stop_actor(name, rec)
  end
  return true
end

--- __actor_stats(): counters and memory, as a map.
function H.stats()
  local live, modules = 0, 0
  for _ in pairs(actors) do live = live + 1 end
  for _ in pairs(sources) do modules = modules + 1 end
  local used, peak, limit = native.memory()
  return { defines = stats.defines, modules = modules, spawns = stats.spawns, actors = live, calls = stats.calls,
    waiting = nsuspended,
    stops = stats.stops, errors = stats.errors, mem_bytes = used, mem_peak = peak, mem_limit = limit }
end

--- Stops every actor (the proc is closing its actor state).
function H.close_all()
  for name, rec in pairs(actors) do stop_actor(name, rec) end
end

return H
