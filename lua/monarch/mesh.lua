--- Meshes: HostMesh (host agents) and ProcMesh (procs spawned on them).
-- A ProcMesh is a shape over a list of procs; slicing makes a new ProcMesh
-- over a subset of the same procs. Every verb sends through the runtime.
local core = require "monarch.core"
local errors = require "monarch.errors"
local runtime = require "monarch.runtime"
local shape_mod = require "monarch.shape"
local value_mesh = require "monarch.value_mesh"

local M = {}
local unpack = unpack or table.unpack

--- What every verb that sends calls runs first (collectives too): the modules above add theirs with
-- mesh.on_before_call(fn) (monarch.tensor and monarch.gpu send the frees of the tensors the GC
-- collected, so that they reach the procs before the call); nothing here replaces their functions.
-- The hooks are chained into one function, not looped over: a loop inside every call kept LuaJIT
-- from compiling a script's loop of calls (its trace hit the unroll limit with submit's own loop).
local before_call = function() end

--- Adds fn() to what runs before every call a mesh sends, after the hooks added before it.
function M.on_before_call(fn)
  local prev = before_call
  before_call = function()
    prev()
    fn()
  end
end

--- Runs the before-call hooks.
function M.before_call() return before_call() end

local procs_mod = require "monarch.procs"
local wait_until = procs_mod.wait_until

--- Connects to host agents at addrs ({"host:port", ...}); returns the agent objects.
function M.connect_agents(addrs)
  local agents = {}
  for i, addr in ipairs(addrs) do
    local host, port = addr:match("^%[?([^%]]+)%]?:(%d+)$")
    if not host then error("host address '" .. addr .. "' is not HOST:PORT", 3) end
    local a = { addr = host, port = tonumber(port), index = i - 1 }
    procs_mod.connect_agent(a)
    agents[i] = a
  end
  local ok, err = pcall(wait_until, function()
    for _, a in ipairs(agents) do if a.state == "connecting" then return false end end
    return true
  end, procs_mod.CONNECT_TIMEOUT, "connecting to host agents")
  for _, a in ipairs(agents) do
    if a.state ~= "ready" then
      error(errors.new { kind = "connect", host = a.addr .. ":" .. a.port,
        message = "cannot reach host agent: " .. tostring(a.reason or (not ok and tostring(err)) or "no answer") }, 3)
    end
  end
  return agents
end

-- ---- the job ---------------------------------------------------------------------

local job = { config = {} } -- hosts: how monarch makes the job's HostMesh; config: monarch.config

--- Called once by monarch (init.lua), which sits above every module: hosts() makes (once) and
-- returns the job's HostMesh (monarch.hosts), config is monarch.config (monarch-run's settings).
-- The features that need the job (persist, join) ask here.
function M.set_job(hosts, config) job.hosts, job.config = hosts, config end

--- The job's HostMesh (monarch.hosts(): started on first use).
function M.job_hosts()
  if not job.hosts then error("the job's hosts are not known yet: load monarch first", 2) end
  return job.hosts()
end

--- monarch.config: the settings monarch-run filled in (hosts, hostfile, ...).
function M.job_config() return job.config end

-- ---- HostMesh --------------------------------------------------------------------

local HostMesh = {}
HostMesh.__index = HostMesh

function M.host_mesh(agents)
  return setmetatable({ agents = agents, shape = shape_mod.new({ "hosts" }, { #agents }) }, HostMesh)
end

function HostMesh:size() return #self.agents end
HostMesh.__tostring = function(h)
  local names = {}
  for i, a in ipairs(h.agents) do names[i] = (a.hostname or a.addr) .. ":" .. a.port end
  return "HostMesh" .. tostring(h.shape) .. " [" .. table.concat(names, ", ") .. "]"
end

local function parse_dims(spec)
  local names, sizes = {}, {}
  if spec[1] ~= nil then
    for i, d in ipairs(spec) do
      if type(d) ~= "table" or type(d[1]) ~= "string" then
        error("spawn_procs: entry " .. i .. " must be {name, size}", 4)
      end
      names[#names + 1], sizes[#sizes + 1] = d[1], d[2]
    end
  else
    for k, v in pairs(spec) do
      if type(k) == "string" and k ~= "name" and k ~= "gpus" then names[#names + 1], sizes[#sizes + 1] = k, v end
    end
    if #names > 1 then
      error("spawn_procs: several named dimensions need an order; write {{'" .. names[1] .. "', " ..
        tostring(sizes[1]) .. "}, {'" .. names[2] .. "', " .. tostring(sizes[2]) .. "}}", 4)
    end
  end
  if #names == 0 then names, sizes = { "procs" }, { 1 } end
  local per_host = 1
  for i, n in ipairs(names) do
    if n == "hosts" then error("spawn_procs: 'hosts' is the host dimension; name yours differently", 4) end
    local s = sizes[i]
    if type(s) ~= "number" or s < 1 or s ~= math.floor(s) or s > 4096 then
      error("spawn_procs: dimension '" .. n .. "' wants an integer size 1..4096, got " .. tostring(s), 4)
    end
    per_host = per_host * s
  end
  if per_host > 4096 then error("spawn_procs: " .. per_host .. " procs per host exceeds the agent's limit of 4096", 4) end
  return names, sizes
end

local before_spawn -- monarch.ship's: a host's workspace gets what was synced before its procs start

--- Called once by monarch.ship: fn(agents, like) before procs are spawned on those agents (like: the agents
-- of the mesh a grow adds them to, from spawn_procs' internal `at`).
function M.set_before_spawn(fn) before_spawn = fn end

--- Spawns procs on every host. spec: {procs = n} (or any one name), or an
-- ordered list {{"dp", 2}, {"tp", 2}}; gpus = G (GPUs per host) makes GPU
-- procs, local proc i pinned to GPU i (at most G procs per host). Returns a
-- ProcMesh of shape {hosts = H, ...}. at = {rank_base, world} (monarch.join's
-- grow) numbers the procs base.. of that world instead of 0.. of their own.
function HostMesh:spawn_procs(spec, at)
  spec = spec or { procs = 1 }
  if type(spec) ~= "table" then error("spawn_procs wants a table like {procs = 4}", 2) end
  local names, sizes = parse_dims(spec)
  local per_host = 1
  for _, s in ipairs(sizes) do per_host = per_host * s end
  local gpus = spec.gpus
  if gpus ~= nil then
    if type(gpus) ~= "number" or gpus < 1 or gpus ~= math.floor(gpus) then
      error("spawn_procs: gpus wants the number of GPUs per host (a positive integer), got " .. tostring(gpus), 2)
    end
    if per_host > gpus then
      error(string.format("spawn_procs: %d procs per host but gpus = %d: GPU procs are pinned one per GPU", per_host, gpus), 2)
    end
  end
  -- The hosts as they are now: one that joins while the spawn waits is appended to self.agents, and gets none.
  local agents = {}
  for i = 1, #self.agents do agents[i] = self.agents[i] end
  local world, base = at and at.world or per_host * #agents, at and at.rank_base or 0
  if before_spawn then before_spawn(agents, at and at.like) end
  local procs = procs_mod.spawn(agents, per_host, { base = base, world = world, gpus = gpus }, 2)
  local dims_n, dims_s = { "hosts" }, { #agents }
  for i = 1, #names do dims_n[i + 1], dims_s[i + 1] = names[i], sizes[i] end
  return M.proc_mesh(procs, shape_mod.new(dims_n, dims_s), {})
end

-- ---- ProcMesh --------------------------------------------------------------------

local ProcMesh = {}
ProcMesh.__index = ProcMesh

--- Every ProcMesh method, and the module that makes it: the whole list. The
-- methods of monarch.mesh are defined below in this file; another module
-- hands its own in with mesh.provide, which refuses a name not listed here
-- for that module. Until that module is loaded, each of its names is a stub
-- that loads it, so no method depends on what the script required first.
M.METHODS = {
  -- monarch.mesh: shape, views and policies
  size = "monarch.mesh", sizes = "monarch.mesh", rank = "monarch.mesh", procs = "monarch.mesh",
  proc_list = "monarch.mesh",
  slice = "monarch.mesh", options = "monarch.mesh", on_restart = "monarch.mesh", on_failure = "monarch.mesh",
  ready = "monarch.mesh", stop = "monarch.mesh", ping = "monarch.mesh", survivors = "monarch.mesh",
  -- monarch.mesh: kernel calls (_submit is the one they share, also used by the modules below)
  load = "monarch.mesh", call = "monarch.mesh", call_one = "monarch.mesh", broadcast = "monarch.mesh",
  choose = "monarch.mesh", stream = "monarch.mesh", _submit = "monarch.mesh",
  -- tensors on the procs
  tensor = "monarch.tensor",
  -- Lua actors on the procs
  spawn = "monarch.actor",
  -- CPU collectives and proc-to-proc copies over direct proc links
  all_reduce = "monarch.collective", broadcast_tensor = "monarch.collective", all_gather = "monarch.collective",
  reduce_scatter = "monarch.collective", barrier = "monarch.collective", copy = "monarch.collective",
  group = "monarch.collective", -- a group for kernels' own collectives (mk_all_reduce, ...)
  -- GPU tensors and NCCL collectives
  gpu_tensor = "monarch.gpu", gpu_info = "monarch.gpu", gpu_sync = "monarch.gpu",
  gpu_all_reduce = "monarch.gpu", gpu_broadcast = "monarch.gpu", gpu_all_gather = "monarch.gpu",
  gpu_reduce_scatter = "monarch.gpu",
  _gpu_group_comms = "monarch.gpu", _gpu_free_group_comms = "monarch.gpu", -- collective's mesh:group{gpu = true}
  -- persistent meshes (the REPL's)
  persist = "monarch.persist", detach = "monarch.persist",
  -- more hosts: procs on hosts that joined the job, with the mesh's libraries
  grow = "monarch.join",
}

local stubs = {} -- method name -> the stub standing in for it

--- Adds `methods` (name -> function) to ProcMesh on behalf of `module`,
-- which M.METHODS must name as their maker.
function M.provide(module, methods)
  for name, fn in pairs(methods) do
    if M.METHODS[name] ~= module or module == "monarch.mesh" then
      error(string.format("%s cannot add ProcMesh:%s (mesh.lua lists it for %s)", module, name,
        tostring(M.METHODS[name])), 2)
    end
    ProcMesh[name] = fn
  end
end

for name, module in pairs(M.METHODS) do
  if module ~= "monarch.mesh" then
    local function stub(...)
      require(module)
      if ProcMesh[name] == stub then error(module .. " did not provide ProcMesh:" .. name, 2) end
      return ProcMesh[name](...)
    end
    stubs[name] = stub
    ProcMesh[name] = stub
  end
end

--- True if ProcMesh:name is still a stub (its module not loaded yet).
function M.is_stub(name) return stubs[name] ~= nil and ProcMesh[name] == stubs[name] end

function M.proc_mesh(procs, shape, opts, libs)
  return setmetatable({ _procs = procs, shape = shape, _opts = opts or {}, _libs = libs or {}, _rr = 0 }, ProcMesh)
end

--- A mesh of the given procs along one dimension "procs", for calls to them alone (one proc, a group of a
-- collective, the holders of a tensor). libs: the kernel libraries it records as loaded (default none).
function M.flat(procs, libs)
  return M.proc_mesh(procs, shape_mod.new({ "procs" }, { #procs }), {}, libs)
end

--- Number of procs.
function ProcMesh:size(dim)
  if dim then return self.shape:dim(dim) or error("no dimension named '" .. tostring(dim) .. "'", 2) end
  return #self._procs
end

--- Sizes by dimension name: {hosts = 1, procs = 4}.
function ProcMesh:sizes()
  local t = {}
  for i, n in ipairs(self.shape.names) do t[n] = self.shape.sizes[i] end
  return t
end

--- Global rank of the proc at coordinates (table or positional), or the list of ranks.
function ProcMesh:rank(...)
  if select("#", ...) == 0 then
    local r = {}
    for i, p in ipairs(self._procs) do r[i] = p.rank end
    return r
  end
  local c = ...
  if type(c) ~= "table" then c = { ... } end
  return self._procs[self.shape:index(c)].rank
end

--- The proc records of this mesh, in position order: the live list itself, not a copy (no
-- allocation; the call paths read it per call). Read-only by contract: a caller that wants to
-- change it copies it. Every module but this one reaches a mesh's procs through it.
function ProcMesh:proc_list() return self._procs end

--- Summaries of the procs (rank, host, pid, state, cause) for inspection: copies.
function ProcMesh:procs()
  local out = {}
  for i, p in ipairs(self._procs) do
    out[i] = { rank = p.rank, host = p.host, pid = p.pid, state = p.state, cause = p.cause }
  end
  return out
end

--- A view of the same procs along fewer positions: {dim = i} drops dim,
-- {dim = {from, to}} keeps positions from..to-1.
function ProcMesh:slice(spec)
  if type(spec) ~= "table" then error("slice wants a table like {procs = 0} or {procs = {0, 2}}", 2) end
  local s, keep = self.shape:slice(spec)
  local procs = {}
  for i, k in ipairs(keep) do procs[i] = self._procs[k] end
  return M.proc_mesh(procs, s, self._opts, self._libs)
end

local OPTIONS = { timeout = "number", retries = "number", backoff = "number", restart = "boolean", cancel_grace = "number" }

--- A view of this mesh whose calls use these options (policies as data):
--   timeout = s     fail a call not answered within s seconds (kind "timeout") and cancel it on its procs
--   cancel_grace = s  a proc still running a cancelled call s seconds after the cancel is hung:
--                   it is killed (kind "unresponsive") and, under restart, replaced (default 5)
--   retries = n     try a call again up to n times when its proc fails (not when the kernel does)
--   backoff = s     first retry delay, doubling per try (default 0.1)
--   restart = true  respawn a failed proc, reload its kernel libraries, re-create its
--                   tensors (zeroed) and run the on_restart hooks; applies to the procs
function ProcMesh:options(o)
  local merged = {}
  for k, v in pairs(self._opts) do merged[k] = v end
  for k, v in pairs(o or {}) do
    if not OPTIONS[k] then error("unknown call option '" .. tostring(k) .. "' (known: timeout, retries, backoff, restart, cancel_grace)", 2) end
    if type(v) ~= OPTIONS[k] or (OPTIONS[k] == "number" and (v < 0 or (k ~= "retries" and v == 0))) then
      error("option " .. k .. " wants a " .. (OPTIONS[k] == "number" and "positive number" or "boolean") .. ", got " .. tostring(v), 2)
    end
    merged[k] = v
  end
  if merged.restart ~= nil then
    for _, p in ipairs(self._procs) do p.restart = merged.restart end
  end
  return M.proc_mesh(self._procs, self.shape, merged, self._libs)
end

--- Runs fn(mesh_of_one, rank) after a proc of this mesh is restarted, once its
-- kernel libraries and tensors are back and before the calls that waited for it:
-- the place to restore state. Use with options{restart = true}.
function ProcMesh:on_restart(fn)
  if type(fn) ~= "function" then error("on_restart wants a function", 2) end
  -- monarch.procs runs a proc's init hooks as hook(p): this one hands fn the mesh of that one proc.
  local function hook(p) return fn(M.flat({ p }), p.rank) end
  for _, p in ipairs(self._procs) do
    p.init_hooks = p.init_hooks or {}
    p.init_hooks[#p.init_hooks + 1] = hook
  end
  return self
end

-- Whether p's host is gone for good (its agent closed): it and every proc on it.
local function host_gone(p) return p.host_lost ~= nil or (p.agent and p.agent.state == "dead") end

--- The mesh without the hosts that were lost (kind host_lost): same
-- dimensions, fewer positions along "hosts" (a mesh without that dimension
-- drops the lost procs along its only one). Returns the mesh and the number
-- of procs dropped. Its collectives form new groups over the survivors.
function ProcMesh:survivors()
  local names, sizes = self.shape.names, self.shape.sizes
  local hsize, hdim = self.shape:dim("hosts")
  if not hsize then
    if #names ~= 1 then error("survivors: a mesh without a 'hosts' dimension must have one dimension", 2) end
    hsize, hdim = sizes[1], 1
  end
  local stride = 1
  for d = hdim + 1, #names do stride = stride * sizes[d] end
  local function host_of(i) return math.floor((i - 1) / stride) % hsize end
  local gone, nhosts = {}, hsize -- one pass: a position is gone with any of its procs' hosts
  for i, p in ipairs(self._procs) do
    local h = host_of(i)
    if not gone[h] and host_gone(p) then gone[h], nhosts = true, nhosts - 1 end
  end
  if nhosts == hsize then return self, 0 end
  if nhosts == 0 then
    error(errors.new { kind = "host_lost", message = "survivors: every host of " .. tostring(self) .. " was lost" }, 2)
  end
  local procs = {}
  for i, p in ipairs(self._procs) do
    if not gone[host_of(i)] then procs[#procs + 1] = p end
  end
  local nsizes = {}
  for d = 1, #names do nsizes[d] = d == hdim and nhosts or sizes[d] end
  return M.proc_mesh(procs, shape_mod.new(names, nsizes), self._opts, self._libs), #self._procs - #procs
end

--- Waits until every proc of this mesh is ready (restarted ones included);
-- raises if one is dead for good or the wait exceeds timeout (default 60 s).
function ProcMesh:ready(timeout)
  wait_until(function()
    for _, p in ipairs(self._procs) do
      if p.state == "dead" or p.state == "stopped" then
        error(errors.new { kind = "proc_failed", rank = p.rank, host = p.host, pid = p.pid, cause = p.cause,
          message = "proc is " .. p.state .. (p.cause and (" (" .. p.cause .. ")") or "") }, 0)
      end
      if p.state ~= "ready" then return false end
    end
    return true
  end, timeout or 60, "waiting for the mesh to be ready")
  return self
end

local function check_kernel(kernel, level)
  if type(kernel) ~= "string" or kernel == "" then
    error("kernel name must be a non-empty string, got " .. type(kernel), level + 1)
  end
end

function ProcMesh:_submit(kernel, args, nargs, o)
  before_call()
  local shape = self.shape
  local convert = o.convert
  return runtime.submit(self._procs, kernel, args, nargs, {
    mode = o.mode, timeout = o.timeout or self._opts.timeout, what = o.what, on_slot = o.on_slot,
    retries = self._opts.retries, backoff = self._opts.backoff, cancel_grace = self._opts.cancel_grace,
    make_result = function(values, n)
      if convert then
        for i = 1, n do values[i] = convert(values[i]) end
      end
      return value_mesh.new(shape, values, n)
    end,
  }).future
end

-- A proc's list of loaded libraries (for a restart to load again) is shared by every proc with the
-- same history, and never changed in place: a mesh of thousands holds a few lists, not one each.
local NO_LIBS, after = {}, setmetatable({}, { __mode = "k" }) -- after[list][lib]: list with lib appended
local function with_lib(libs, lib)
  libs = libs or NO_LIBS
  for _, l in ipairs(libs) do if l == lib then return libs end end
  local nexts = after[libs]
  if not nexts then
    nexts = {}
    after[libs] = nexts
  end
  if not nexts[lib] then
    local l = { unpack(libs) }
    l[#l + 1] = lib
    nexts[lib] = l
  end
  return nexts[lib]
end

local shipper -- monarch.ship's: ships a library path to the hosts that lack it (M.set_shipper)

--- Called once by monarch.ship: fn(procs, lib, what) ships lib where needed and returns name(agent), the name
-- that agent's procs load it by; or nil for a library that is not shipped (a name, a path the controller lacks).
function M.set_shipper(fn) shipper = fn end

-- The load of lib on procs, each host's procs by the name their host gives it: one future per name.
local function load_futures(self, lib, what, fresh)
  local name = shipper and shipper(self._procs, lib, what, fresh)
  if not name then return { self:_submit("__load", { lib }, 1, { what = what }) } end
  local groups, order = {}, {}
  for _, p in ipairs(self._procs) do
    local n = name(p.agent)
    if not groups[n] then
      groups[n] = {}
      order[#order + 1] = n
    end
    groups[n][#groups[n] + 1] = p
  end
  local futs = {}
  for i, n in ipairs(order) do
    futs[i] = runtime.submit(groups[n], "__load", { n }, 1, { what = what, timeout = self._opts.timeout,
      retries = self._opts.retries, backoff = self._opts.backoff,
      make_result = function(values) return values end }).future
  end
  return futs
end

--- Loads a kernel library on every proc (blocking); raises a clear error if any proc cannot. A path to a
-- library the controller has is shipped to the hosts that lack it (monarch.ship).
function ProcMesh:load(lib)
  check_kernel(lib, 2)
  local what = "load of '" .. lib .. "'"
  local function get_all(futs)
    for _, fut in ipairs(futs) do fut:get() end
  end
  local ok, err = pcall(function()
    local futs = load_futures(self, lib, what, false)
    local shipped = shipper ~= nil and lib:find("/", 1, true) ~= nil
    local ok1, e1 = pcall(get_all, futs)
    -- A host's cache lost a shipped library since it said it had it (another job's files evicted it): ask again.
    if not ok1 and shipped and tostring(e1):find("kernel library 'ship:", 1, true) then
      get_all(load_futures(self, lib, what, true))
    elseif not ok1 then
      error(e1, 0)
    end
  end)
  if not ok then
    if errors.is(err) then
      err.kernel = nil
      err.kind = "load"
    end
    error(err, 2)
  end
  self._libs[#self._libs + 1] = lib
  for _, p in ipairs(self._procs) do p.libs = with_lib(p.libs, lib) end
  return self
end

--- Calls kernel(...) on every proc; returns a Future of a ValueMesh.
-- A Group (ProcMesh:group) among the arguments goes as its id, for the
-- kernel's 'g' argument; the Future then fails with the most telling
-- member's error when the kernel's collectives fail.
function ProcMesh:call(kernel, ...)
  check_kernel(kernel, 2)
  local args, n, wraps = { ... }, select("#", ...), nil
  for i = 1, n do
    local a = args[i]
    if type(a) == "table" and rawget(a, "__mn_group") then
      local wrap
      args[i], wrap = a:_bind(self, 2)
      wraps = wraps or {}
      wraps[#wraps + 1] = wrap
    end
  end
  local fut = self:_submit(kernel, args, n, {})
  for _, wrap in ipairs(wraps or {}) do fut = wrap(fut) end
  return fut
end

--- Calls kernel(...) on the one proc of this mesh; returns a Future of its value.
function ProcMesh:call_one(kernel, ...)
  check_kernel(kernel, 2)
  if #self._procs ~= 1 then
    error("call_one needs a mesh of exactly one proc; this one has " .. #self._procs .. " (slice it first)", 2)
  end
  before_call()
  return runtime.submit(self._procs, kernel, { ... }, select("#", ...), { mode = "one", timeout = self._opts.timeout,
    retries = self._opts.retries, backoff = self._opts.backoff, cancel_grace = self._opts.cancel_grace }).future
end

--- Calls kernel(...) on every proc without waiting for results. A failure
-- stops the script at its next wait (use call() to handle errors yourself).
function ProcMesh:broadcast(kernel, ...)
  check_kernel(kernel, 2)
  before_call()
  runtime.submit(self._procs, kernel, { ... }, select("#", ...), { mode = "broadcast", timeout = self._opts.timeout,
    retries = self._opts.retries, backoff = self._opts.backoff, cancel_grace = self._opts.cancel_grace })
end

--- Calls kernel(...) on one live proc, the least busy; returns a Future of its value.
function ProcMesh:choose(kernel, ...)
  check_kernel(kernel, 2)
  local best, best_load
  local n = #self._procs
  for k = 1, n do
    local i = (self._rr + k - 1) % n + 1
    local p = self._procs[i]
    if p.state == "ready" then
      local _, _, _, _, inflight = core.info(p.conn)
      if not best or inflight < best_load then best, best_load = p, inflight end
    end
  end
  self._rr = self._rr + 1
  if not best then error(errors.new { kind = "proc_failed", kernel = kernel, message = "no live proc in this mesh to choose" }, 2) end
  before_call()
  return runtime.submit({ best }, kernel, { ... }, select("#", ...), { mode = "one", timeout = self._opts.timeout,
    retries = self._opts.retries, backoff = self._opts.backoff, cancel_grace = self._opts.cancel_grace,
    choose_from = self._procs }).future
end

--- Calls kernel(...) on every proc and iterates (coords, value) as results arrive.
-- A failed proc raises its error from the loop.
function ProcMesh:stream(kernel, ...)
  check_kernel(kernel, 2)
  local args, nargs = { ... }, select("#", ...)
  return M.stream_results(self.shape, #self._procs, function(on_slot)
    return self:_submit(kernel, args, nargs, { on_slot = on_slot })
  end)
end

--- The iterator behind stream(): start(on_slot) sends the call and returns
-- its Future; the iterator yields (coords, value) in arrival order and
-- raises a failed slot's error, or the call's timeout.
function M.stream_results(shape, total, start)
  local queue, head, tail, seen = {}, 1, 0, 0
  local fut = start(function(slot, ok, v)
    tail = tail + 1
    queue[tail] = { slot, ok, v }
  end)
  return function()
    if seen == total then return nil end
    while head > tail do
      -- A call timeout fails the future without delivering the missing slots.
      if fut.state == "error" and fut.err.kind == "timeout" then
        seen = total
        error(fut.err, 2)
      end
      runtime.pump(nil)
    end
    local e = queue[head]
    queue[head] = nil
    head = head + 1
    seen = seen + 1
    if seen == total then fut.observed = true end
    if not e[2] then error(e[3], 2) end
    return shape:coords(e[1]), e[3]
  end
end

--- Calls fn(err) whenever a proc of this mesh fails.
function ProcMesh:on_failure(fn)
  if type(fn) ~= "function" then error("on_failure wants a function", 2) end
  for _, p in ipairs(self._procs) do
    p.listeners = p.listeners or {}
    p.listeners[#p.listeners + 1] = fn
  end
  return self
end

local next_ping = 0

--- Pings every proc's I/O thread (answered even while a kernel runs).
-- Returns a Future of a ValueMesh of round-trip seconds.
function ProcMesh:ping()
  local fut = require("monarch.future").new("ping")
  local n, left, values = #self._procs, #self._procs, {}
  local shape = self.shape
  for i, p in ipairs(self._procs) do
    if p.state ~= "ready" then
      fut:fail(errors.new { kind = "proc_failed", rank = p.rank, host = p.host, pid = p.pid, message = "proc is " .. p.state })
      return fut
    end
    next_ping = next_ping + 1
    local t0 = runtime.now()
    p.pings = p.pings or {}
    p.pings[next_ping] = function()
      values[i] = runtime.now() - t0
      left = left - 1
      if left == 0 then fut:resolve(value_mesh.new(shape, values, n)) end
    end
    core.send(p.conn, { core.MSG.PING, next_ping })
  end
  return fut
end

--- Stops the procs of this mesh.
function ProcMesh:stop()
  for _, p in ipairs(self._procs) do
    if p.state ~= "dead" and p.state ~= "stopped" then
      p.stopping = true
      p.restart = false
      procs_mod.kill(p, 15)
    end
  end
end

ProcMesh.__tostring = function(m)
  local alive = 0
  for _, p in ipairs(m._procs) do if p.state == "ready" then alive = alive + 1 end end
  return string.format("ProcMesh%s (%d procs, %d alive)", tostring(m.shape), #m._procs, alive)
end

for name, module in pairs(M.METHODS) do
  if module == "monarch.mesh" then assert(ProcMesh[name], "ProcMesh:" .. name .. " is listed but not defined") end
end

M.HostMesh, M.ProcMesh = HostMesh, ProcMesh
return M
