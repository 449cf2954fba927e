--- GPU tensors and NCCL collectives on ProcMesh.
--   local procs = monarch.hosts():spawn_procs{ procs = 1 }
--   local info = assert(gpu.info(procs))         -- nil, reason without a GPU
--   procs:load "cuda_basic"                      -- fill, axpy, sum, sgemm... on the GPU
--   local t = procs:gpu_tensor("f32", { 1024 })  -- device memory, one per proc
--   procs:call("fill", t, 1):get()
--   procs:gpu_all_reduce(t, "sum"):get()         -- NCCL, in place
--   t:fetch():get()[1]:totable()
-- Each proc keeps its GPU tensors on its own device (device 0 of what it
-- sees; GPU procs are pinned one per device). Communicators are made the
-- first time a mesh (or one dimension of it) runs a collective: proc 0 of
-- each group makes an NCCL id, the controller hands it to every member, and
-- the communicator is cached on the procs and here, per mesh and dimension.
local checks = require "monarch.checks"
local collective = require "monarch.collective"
local errors = require "monarch.errors"
local mesh = require "monarch.mesh"
local runtime = require "monarch.runtime"
local tensor = require "monarch.tensor"

local M = {}
local methods = {} -- the ProcMesh methods this module makes (mesh.METHODS lists them)

-- GPU tensor ids live far above the CPU tensors' (tensor.lua counts from 1),
-- so both kinds share each proc's registry without colliding.
local ID_BASE = 2 ^ 48
local next_id = 0
local to_free = {} -- { procs, id } queued by the GC, sent with the next call

--- Seconds a communicator's setup may take before the call fails (every
-- member must join; a proc that never does would otherwise hang it).
M.init_timeout = 120

-- ---- GPU tensors ---------------------------------------------------------------

local GpuTensor = setmetatable({}, { __index = tensor.Tensor })
GpuTensor.__index = GpuTensor

-- Sends the frees the GC queued, to the procs still running (a stopped or
-- dead proc took its device memory with it).
local function flush_frees()
  if #to_free == 0 then return end
  local batch = to_free
  to_free = {}
  for _, f in ipairs(batch) do
    local live = {}
    for _, p in ipairs(f[1]) do
      if p.state == "ready" then live[#live + 1] = p end
    end
    if #live > 0 then runtime.submit(live, "__gpu_free", { f[2] }, 1, { mode = "broadcast" }) end
  end
end

-- Every call a mesh sends flushes tensor.lua's queue; GPU frees ride along with it.
mesh.on_before_call(flush_frees)

local numel_of = checks.numel

--- A zeroed tensor of dtype and shape in the GPU memory of every proc of this
-- mesh (each proc's own device). Kernels of a GPU library (cuda_basic) take
-- it like any tensor; fetch and put copy through the host.
function methods:gpu_tensor(dtype, shape)
  shape = checks.tensor_spec(dtype, shape, 2)
  mesh.before_call()
  next_id = next_id + 1
  local id = ID_BASE + next_id
  local procs = self:proc_list()
  local t = setmetatable({ __mn_tensor = id, dtype = dtype, shape = shape, numel = numel_of(shape), mesh = self,
    device = "cuda" }, GpuTensor)
  runtime.submit(procs, "__gpu_tensor_new", { id, dtype, shape }, 3, { mode = "broadcast" })
  local proxy = newproxy(true)
  getmetatable(proxy).__gc = function() to_free[#to_free + 1] = { procs, id } end
  rawset(t, "_gc", proxy)
  return t
end

local function check_live(t, level)
  if rawget(t, "freed") then error(string.format("GPU tensor %d was freed", t.__mn_tensor - ID_BASE), level + 1) end
end

--- Copies every proc's tensor to the controller: Future of a ValueMesh of HostTensor.
function GpuTensor:fetch()
  check_live(self, 2)
  local dtype, shape = self.dtype, self.shape
  return self.mesh:_submit("__gpu_fetch", { self }, 1, {
    what = string.format("fetch of GPU tensor %d", self.__mn_tensor - ID_BASE),
    convert = function(bytes) return tensor.host(dtype, shape, bytes) end,
  })
end

--- Writes the same values (a Lua array, a HostTensor or a byte string) into
-- every proc's tensor. Returns a Future that is done when all procs have them.
function GpuTensor:put(values)
  check_live(self, 2)
  local bytes = values
  if type(values) == "table" then
    if tensor.is_host(values) then
      bytes = values:bytes()
    else
      if #values ~= self.numel then
        error(string.format("put of %d values into a tensor of %d", #values, self.numel), 2)
      end
      local h = tensor.host(self.dtype, self.shape)
      for i = 1, #values do h.data[i - 1] = values[i] end
      bytes = h:bytes()
    end
  end
  if type(bytes) ~= "string" then error("put wants a table, a HostTensor or a string", 2) end
  return self.mesh:call("__gpu_put", self, bytes)
end

--- Frees the tensor's device memory on every proc now (instead of when collected).
function GpuTensor:free()
  if rawget(self, "freed") then return end
  rawset(self, "freed", true)
  getmetatable(rawget(self, "_gc")).__gc = nil
  runtime.submit(self.mesh:proc_list(), "__gpu_free", { self.__mn_tensor }, 1, { mode = "broadcast" })
end

GpuTensor.__tostring = function(t)
  return string.format("GpuTensor(%d, %s, {%s}) on %d procs", t.__mn_tensor - ID_BASE, t.dtype,
    table.concat(t.shape, ","), #t.mesh:proc_list())
end

--- True if v is a GPU tensor.
function M.is(v) return getmetatable(v) == GpuTensor end

-- ---- devices ------------------------------------------------------------------------

local INFO_FIELDS = { "count", "name", "total_bytes", "free_bytes", "capability", "runtime_version",
  "driver_version", "device" }

--- What each proc's GPU is: Future of a ValueMesh of tables {count, name,
-- total_bytes, free_bytes, capability ("9.0"), runtime_version,
-- driver_version, device}. Fails with kind "no_gpu" and the reason (no CUDA
-- runtime, no device) where there is none.
function methods:gpu_info()
  return self:_submit("__gpu_info", {}, 0, {
    what = "gpu_info",
    convert = function(v)
      local t = {}
      for i, k in ipairs(INFO_FIELDS) do t[k] = v[i] end
      return t
    end,
  })
end

--- The first proc's GPU as a table (see ProcMesh:gpu_info), or nil and the
-- reason this mesh has none. Blocks.
function M.info(procs)
  local ok, vm = pcall(function() return procs:gpu_info():get() end)
  if not ok then return nil, errors.is(vm) and vm.message or tostring(vm) end
  return vm[1]
end

--- Waits until every proc's device has finished its work. Future of a ValueMesh.
function methods:gpu_sync()
  return self:_submit("__gpu_sync", {}, 0, { what = "gpu_sync" })
end

-- ---- communicators ------------------------------------------------------------------

local comms = setmetatable({}, { __mode = "k" }) -- first proc record -> { key -> comm id }
local next_comm = 0

-- The groups of a collective: lists of flat indices into mesh:proc_list(), each in
-- rank order. No dim: one group of all procs; dim: one group per position of
-- the other dimensions, along dim.
local function groups_of(m, dim)
  if dim == nil then
    local all = {}
    for i = 1, #m:proc_list() do all[i] = i end
    return { all }
  end
  if not m.shape:dim(dim) then error("no dimension named '" .. tostring(dim) .. "' in " .. tostring(m.shape), 4) end
  local groups, order = {}, {}
  for i = 1, #m:proc_list() do
    local c, parts = m.shape:coords(i), {}
    for _, name in ipairs(m.shape.names) do
      if name ~= dim then parts[#parts + 1] = c[name] end
    end
    local key = table.concat(parts, ",")
    if not groups[key] then
      groups[key] = {}
      order[#order + 1] = key
    end
    table.insert(groups[key], i)
  end
  local out = {}
  for i, key in ipairs(order) do out[i] = groups[key] end
  return out
end

local function cache_key(m, dim)
  local ranks = {}
  for i, p in ipairs(m:proc_list()) do ranks[i] = p.rank end
  return table.concat(ranks, ",") .. "/" .. (dim or "*")
end

-- Makes communicator cid on the procs of m, one NCCL communicator per group
-- (a list of flat indices into m:proc_list(), in rank order) under the same id:
-- the group's first proc makes the NCCL id, every member joins with it.
-- Raises (after releasing cid everywhere) if any member fails to join.
local function make_comms(m, groups, cid, level)
  local all, id_futs = m:proc_list(), {}
  for g, members in ipairs(groups) do
    local p = all[members[1]]
    id_futs[g] = runtime.submit({ p }, "__gpu_nccl_id", {}, 0, { mode = "one", what = "NCCL id from rank " .. p.rank }).future
  end
  local ids = {}
  for g, f in ipairs(id_futs) do ids[g] = f:get(M.init_timeout) end
  -- A watch group per communicator: its links show a dead peer, which NCCL would wait on until the timeout.
  -- Best effort: without one a dead peer is found by that timeout.
  local watches = {}
  for g, members in ipairs(groups) do
    local procs = {}
    for k, i in ipairs(members) do procs[k] = all[i] end
    local ok, gid = true, 0
    if #procs > 1 then ok, gid = pcall(collective.watch_group, procs, M.init_timeout) end
    watches[g] = ok and gid or 0
  end
  -- Every member must be asked before any answers: ncclCommInitRank waits for the whole group.
  local inits = {}
  for g, members in ipairs(groups) do
    for r, i in ipairs(members) do
      local p = all[i]
      inits[#inits + 1] = runtime.submit({ p }, "__gpu_nccl_init", { cid, ids[g], #members, r - 1, watches[g] }, 5,
        { mode = "one", what = "NCCL init on rank " .. p.rank }).future
    end
  end
  local first
  local deadline = runtime.now() + M.init_timeout -- one bound for the whole group, not per member
  for _, f in ipairs(inits) do
    local ok, err = pcall(f.get, f, math.max(0.001, deadline - runtime.now()))
    if not ok and not first then first = err end
  end
  if first then
    m:_submit("__gpu_nccl_free", { cid }, 1, { what = "gpu communicator release" })
    if errors.is(first) and #m:proc_list() > 1 and tostring(first.message):find("Duplicate GPU", 1, true) then
      first.message = first.message .. " (NCCL needs a GPU per rank: spawn GPU procs with spawn_procs{gpus = N})"
    end
    error(first, level + 1)
  end
  return cid
end

-- Makes the communicators of (m, dim) on the procs; returns the comm id.
local function bootstrap(m, dim, level)
  next_comm = next_comm + 1
  return make_comms(m, groups_of(m, dim), next_comm, level + 1)
end

--[[ ProcMesh:_gpu_group_comms, for mesh:group{ gpu = true } (collective.lua): makes the NCCL
  communicators of kernel group gid, whose lines are `groups` (lists of flat
  indices of m, in position order), under the group's own id, so that a
  kernel's mk_all_reduce on GPU tensors finds the communicator of its group.
  Each line gets a watch group, as mesh collectives' communicators do. ]]
function methods:_gpu_group_comms(groups, gid, level)
  local m = self
  mesh.before_call()
  make_comms(m, groups, gid, level + 1)
end

--- Releases the NCCL communicators of kernel group gid on this mesh's procs (Group:free). Blocks.
function methods:_gpu_free_group_comms(gid)
  self:_submit("__gpu_nccl_free", { gid }, 1, { what = "gpu communicator release" }):get()
end

-- The comm id for collectives of m over dim, made on first use.
local function comm_for(m, dim, level)
  local owner = m:proc_list()[1]
  comms[owner] = comms[owner] or {}
  local key = cache_key(m, dim)
  local cid = comms[owner][key]
  if not cid then
    cid = bootstrap(m, dim, level + 1)
    comms[owner][key] = cid
  end
  return cid, function()
    -- The procs may still hold it (a call can fail before NCCL ran): release it there too.
    if comms[owner][key] == cid then comms[owner][key] = nil end
    m:_submit("__gpu_nccl_free", { cid }, 1, { what = "gpu communicator release" })
  end
end

local function check_tensor(t, what, name, level)
  if not M.is(t) then
    error(string.format("%s: %s must be a GPU tensor (ProcMesh:gpu_tensor), got %s", what, name,
      tensor.is(t) and "a CPU tensor" or type(t)), level + 1)
  end
  check_live(t, level + 1)
end

-- Runs one collective built-in on every proc of m: a Future of nil, like the
-- CPU collectives. A failure drops the cached communicator (the procs release
-- it), so the next call makes a fresh one.
local function run(m, name, args, nargs, opts, forget)
  mesh.before_call()
  local fut = runtime.submit(m:proc_list(), name, args, nargs, {
    mode = "mesh", timeout = opts.timeout or m._opts.timeout, what = name:sub(3),
    make_result = function() return nil end,
  }).future
  fut:on_done(function(d) if d.state == "error" then forget() end end)
  return fut
end

--- All-reduces GPU tensor t in place with NCCL over the procs of this mesh
-- (or, with opts.dim, over each line of procs along that dimension). op:
-- "sum" (default), "max", "min" or "avg"; every dtype (f16 and bf16 too).
-- opts: {dim = name, timeout = seconds}. Returns a Future of nil.
function methods:gpu_all_reduce(t, op, opts)
  op = op or "sum"
  check_tensor(t, "gpu_all_reduce", "the tensor", 2)
  checks.reduce_op(op, "gpu_all_reduce", 2)
  opts = checks.collective_opts(opts, "gpu_all_reduce", 2)
  local cid, forget = comm_for(self, opts.dim, 2)
  return run(self, "__gpu_all_reduce", { cid, t, op }, 3, opts, forget)
end

--- Copies the root's GPU tensor t into every other member's t. root: the
-- root's 0-based position in its group, or a coordinate table (with opts.dim
-- only that dimension's coordinate is read). Returns a Future of nil.
function methods:gpu_broadcast(t, root, opts)
  check_tensor(t, "gpu_broadcast", "the tensor", 2)
  opts = checks.collective_opts(opts, "gpu_broadcast", 2)
  local r = collective.root_position(self, root, opts.dim, "gpu_broadcast")
  local cid, forget = comm_for(self, opts.dim, 2)
  return run(self, "__gpu_broadcast", { cid, t, r }, 3, opts, forget)
end

--- Gathers every member's src into every member's dst, in group order: dst
-- holds n * numel(src) elements of src's dtype. Returns a Future of nil.
function methods:gpu_all_gather(src, dst, opts)
  check_tensor(src, "gpu_all_gather", "src", 2)
  check_tensor(dst, "gpu_all_gather", "dst", 2)
  opts = checks.collective_opts(opts, "gpu_all_gather", 2)
  local cid, forget = comm_for(self, opts.dim, 2)
  return run(self, "__gpu_all_gather", { cid, src, dst }, 3, opts, forget)
end

--- Reduces src (n * numel(dst) elements) over the members and leaves block i
-- of the result in member i's dst. op as for gpu_all_reduce. Returns a Future of nil.
function methods:gpu_reduce_scatter(src, dst, op, opts)
  op = op or "sum"
  check_tensor(src, "gpu_reduce_scatter", "src", 2)
  check_tensor(dst, "gpu_reduce_scatter", "dst", 2)
  checks.reduce_op(op, "gpu_reduce_scatter", 2)
  opts = checks.collective_opts(opts, "gpu_reduce_scatter", 2)
  local cid, forget = comm_for(self, opts.dim, 2)
  return run(self, "__gpu_reduce_scatter", { cid, src, dst, op }, 4, opts, forget)
end

M.GpuTensor = GpuTensor
mesh.provide("monarch.gpu", methods)
return M
