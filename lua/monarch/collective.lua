--- Collectives and proc-to-proc copies on a ProcMesh. The data moves over
-- direct links between the procs (TCP; procs on one host copy large tensors
-- straight out of each other's memory); the controller only sets the links
-- up and hands out the calls. docs/collectives.md describes the algorithms.
--   procs:all_reduce(t, "sum"):get()               -- every proc's t becomes the sum
--   procs:all_reduce(t, "avg", { dim = "dp" })     -- one group per position of the other dims
--   procs:broadcast_tensor(t, { procs = 2 })       -- root by coordinates (or 0-based position)
--   procs:all_gather(src, dst)  procs:reduce_scatter(src, dst, "sum")  procs:barrier()
--   procs:copy(src, { procs = 0 }, dst, { procs = 3 })
-- Each proc runs its calls in order and a collective waits for its peers,
-- so every member of a group must be given the same sequence of collectives.
-- Issued through these methods that holds by construction.
local checks = require "monarch.checks"
local errors = require "monarch.errors"
local future = require "monarch.future"
local mesh = require "monarch.mesh"
local runtime = require "monarch.runtime"
local tensor = require "monarch.tensor"

local M = {}
local methods = {} -- the ProcMesh methods this module makes (mesh.METHODS lists them)

local REDUCE_DTYPES = { f32 = true, f64 = true, i32 = true, i64 = true }

-- Group ids and copy tags count up from a per-controller base, so that a proc
-- that outlives one controller session never takes a later id for an older one.
local id_base = (os.time() % 1048576) * 1048576
local last_id = 0
local function new_id()
  last_id = last_id + 1
  return id_base + last_id
end

local groups = {} -- key (the members, in order) -> { id, key, setup = futures of the first use }

-- A restarted proc keeps its record but gets a new pid and a new data port.
local function incarnation(p) return tostring(p) .. "/" .. tostring(p.pid) end

local function data_addr(p, port)
  local host = p.addr
  if host:find(":", 1, true) then host = "[" .. host .. "]" end
  return host .. ":" .. tostring(port)
end

-- Learns the data address of every proc that has none yet: one round trip, once per proc.
local function ensure_addrs(procs)
  local missing = {}
  for _, p in ipairs(procs) do
    if p._coll_addr == nil or p._coll_pid ~= p.pid then missing[#missing + 1] = p end
  end
  if #missing == 0 then return end
  local rec = runtime.submit(missing, "__coll_port", {}, 0, {
    mode = "mesh", what = "data port lookup", make_result = function(values) return values end,
  })
  local values = rec.future:get()
  for i, p in ipairs(missing) do
    local port = values[i]
    if type(port) == "table" then port = port[1] end -- one result may come bare or in a list
    p._coll_addr, p._coll_pid = data_addr(p, port), p.pid
  end
end

-- The group of these procs (in this order), set up on first use: each member
-- gets __coll_group with the ordered address list, and the calls that follow
-- queue behind it on every proc.
local function group_for(procs, timeout, fresh)
  local parts = {}
  for i, p in ipairs(procs) do parts[i] = incarnation(p) end
  local key = table.concat(parts, ",")
  local g = groups[key]
  if g and not fresh then return g end
  ensure_addrs(procs)
  local addrs, ranks = {}, {}
  for i, p in ipairs(procs) do addrs[i], ranks[i] = p._coll_addr, p.rank end
  g = { id = new_id(), key = key, setup = {} }
  for i, p in ipairs(procs) do
    g.setup[i] = runtime.submit({ p }, "__coll_group", { g.id, i - 1, addrs, ranks }, 4,
      { mode = "one", timeout = timeout, what = "collective group setup" }).future
  end
  if not fresh then groups[key] = g end
  return g
end

-- The dimensions dim names (one name, or a list of names for kernel groups), checked against m's shape: the
-- list, the set, and the product of their sizes.
local function dims_of(m, dim, level)
  local list = type(dim) == "table" and dim or { dim }
  if #list == 0 then error("dim lists no dimension", level + 1) end
  local set, size = {}, 1
  for _, d in ipairs(list) do
    local s = type(d) == "string" and m.shape:dim(d)
    if not s then error("no dimension named '" .. tostring(d) .. "' in " .. tostring(m.shape), level + 1) end
    if set[d] then error("dimension '" .. d .. "' is named twice in dim", level + 1) end
    set[d], size = true, size * s
  end
  return list, set, size
end

-- The groups of a mesh: all of it, or one per combination of the other
-- dimensions' coordinates with its members in order along `dim` (several
-- dimensions: row-major in the order listed). Returns lists of flat (1-based)
-- indices, and the members per group.
local function partition(m, dim, level)
  local n = #m:proc_list()
  if dim == nil then
    local all = {}
    for i = 1, n do all[i] = i end
    return { all }, n
  end
  local list, set, size = dims_of(m, dim, level + 1)
  local out, by_key = {}, {}
  for i = 1, n do
    local c = m.shape:coords(i)
    local key, pos = {}, 0
    for _, name in ipairs(m.shape.names) do
      if not set[name] then key[#key + 1] = c[name] end
    end
    for _, d in ipairs(list) do pos = pos * m.shape:dim(d) + c[d] end
    key = table.concat(key, ",")
    local grp = by_key[key]
    if not grp then
      grp = {}
      by_key[key] = grp
      out[#out + 1] = grp
    end
    grp[pos + 1] = i
  end
  return out, size
end

-- The most telling of several failures: a setup failure, then a mismatch,
-- then a proc that died, then bad arguments, then anything but what the
-- other members see when one fails (a closed link, an abort they relay).
local ECHOES = { "closed its link", "lost the link", "gave up on group", "copying from" }
local function rank_error(e)
  if not errors.is(e) then return 5 end
  if e._setup then return 0 end
  if e.kind == "collective_mismatch" then return 1 end
  if e.kind == "proc_failed" then return 2 end
  if e.kind == "bad_args" then return 3 end
  local m = tostring(e.message)
  for _, echo in ipairs(ECHOES) do
    if m:find(echo, 1, true) then return 5 end
  end
  return 4
end

local function best_error(list)
  local best
  for _, e in ipairs(list) do
    if best == nil or rank_error(e) < rank_error(best) then best = e end
  end
  return best
end

-- A Future that resolves with nil when every future in `futs` succeeded and
-- otherwise fails with the most telling error; on_fail runs first.
local function combine(futs, what, on_fail)
  local f = future.new(what)
  local left, failures = #futs, {}
  local function done()
    if #failures == 0 then return f:resolve(nil) end
    if on_fail then on_fail() end
    local e = best_error(failures)
    if errors.is(e) then e.others = #failures - 1 end
    f:fail(e)
  end
  if left == 0 then f:resolve(nil) end
  for _, x in ipairs(futs) do
    x:on_done(function(d)
      local ok, v = d:result()
      if not ok then
        for _, e in ipairs(errors.is(v) and v.failures or { v }) do
          if d._setup and errors.is(e) then e._setup = true end
          failures[#failures + 1] = e
        end
      end
      left = left - 1
      if left == 0 then done() end
    end)
  end
  return f
end

--- The 0-based position in its group of a broadcast root given as a
-- position or a coordinate table (with dim, only that dimension's coordinate
-- counts). Errors name `what` and point at the caller of the public method.
function M.root_position(mesh, root, dim, what)
  local n = dim and (mesh.shape:dim(dim) or error("no dimension named '" .. dim .. "'", 3)) or #mesh:proc_list()
  local r = root or 0
  if type(r) == "table" then
    if dim then
      r = r[dim]
      if r == nil then error(what .. ": root must give a coordinate for dimension '" .. dim .. "'", 3) end
    else
      r = mesh.shape:index(r) - 1
    end
  end
  if type(r) ~= "number" or r < 0 or r >= n or r ~= math.floor(r) then
    error(string.format("%s: root %s is outside the group's positions 0..%d", what, tostring(r), n - 1), 3)
  end
  return r
end

local function check_tensor(t, what, name, level)
  if not tensor.is(t) then
    error(string.format("%s: %s must be a tensor made with mesh:tensor, got %s", what, name, type(t)), level + 1)
  end
  if rawget(t, "freed") then error(string.format("%s: %s (tensor %d) was freed", what, name, t.__mn_tensor), level + 1) end
end

local function check_reducible(t, what, level)
  if not REDUCE_DTYPES[t.dtype] then
    error(string.format("%s does not support dtype %s (f32, f64, i32, i64)", what, t.dtype), level + 1)
  end
end

-- A GPU tensor (monarch.gpu's, which requires this module: t.device says where a tensor lives): its
-- collectives are the gpu_ methods, NCCL's.
local function on_gpu(t) return type(t) == "table" and t.device == "cuda" end

--[[ Runs one collective: one call per group, each preceded on first use by
  the group's setup. args_for(gid, members) gives the call's arguments.
  Returns a Future of nil. ]]
local function run(m, what, opts, args_for, level)
  local timeout = opts.timeout or m._opts.timeout
  local parts = partition(m, opts.dim, level + 1)
  mesh.before_call()
  local futs, used, all = {}, {}, m:proc_list()
  for _, idx in ipairs(parts) do
    local procs = {}
    for k, i in ipairs(idx) do procs[k] = all[i] end
    local g = group_for(procs, timeout)
    local args, nargs = args_for(g.id, idx)
    for _, s in ipairs(g.setup or {}) do
      s._setup = true
      futs[#futs + 1] = s
    end
    g.setup = nil
    used[#used + 1] = g
    futs[#futs + 1] = runtime.submit(procs, "__coll_" .. what, args, nargs, {
      mode = "mesh", timeout = timeout, what = what, make_result = function() return true end,
    }).future
  end
  -- A failed collective tore its group down on the procs; the next use sets up a new one.
  return combine(futs, what, function()
    for _, g in ipairs(used) do
      if groups[g.key] == g then groups[g.key] = nil end
    end
  end)
end

--- Reduces t elementwise over the procs of this mesh (or, with opts.dim,
-- over each line of procs along that dimension) and leaves the result in
-- every proc's t. op: "sum" (default), "max", "min" or "avg" (integers
-- truncate). dtype f32, f64, i32 or i64. opts: {dim = name, timeout = s}.
-- Returns a Future of nil. The result is bitwise identical on every member.
function methods:all_reduce(t, op, opts)
  if on_gpu(t) then return self:gpu_all_reduce(t, op, opts) end -- NCCL for GPU tensors
  op = op or "sum"
  check_tensor(t, "all_reduce", "the tensor", 2)
  checks.reduce_op(op, "all_reduce", 2)
  check_reducible(t, "all_reduce", 2)
  opts = checks.collective_opts(opts, "all_reduce", 2)
  return run(self, "all_reduce", opts, function(gid) return { gid, t, op }, 3 end, 2)
end

--- Copies the root's t into every other member's t. root: a coordinate table
-- ({procs = 2}; with opts.dim only that dimension's coordinate is read) or
-- the root's 0-based position in the group (for a 1-D mesh, its coordinate).
-- Returns a Future of nil. (ProcMesh:broadcast is the kernel fan-out.)
function methods:broadcast_tensor(t, root, opts)
  if on_gpu(t) then return self:gpu_broadcast(t, root, opts) end -- NCCL for GPU tensors
  check_tensor(t, "broadcast_tensor", "the tensor", 2)
  opts = checks.collective_opts(opts, "broadcast_tensor", 2)
  local r = M.root_position(self, root, opts.dim, "broadcast_tensor")
  return run(self, "broadcast", opts, function(gid) return { gid, t, r }, 3 end, 2)
end

--- Gathers every member's src into every member's dst, in group order:
-- dst holds n * numel(src) elements of src's dtype (n members per group).
-- Returns a Future of nil.
function methods:all_gather(src, dst, opts)
  if on_gpu(src) then return self:gpu_all_gather(src, dst, opts) end -- NCCL for GPU tensors
  check_tensor(src, "all_gather", "src", 2)
  check_tensor(dst, "all_gather", "dst", 2)
  opts = checks.collective_opts(opts, "all_gather", 2)
  local n = opts.dim and (self.shape:dim(opts.dim) or error("no dimension named '" .. opts.dim .. "'", 2)) or self:size()
  if dst.dtype ~= src.dtype or dst.numel ~= n * src.numel then
    error(string.format("all_gather: dst must be %s with %d x %d = %d elements; it is %s with %d",
      src.dtype, n, src.numel, n * src.numel, dst.dtype, dst.numel), 2)
  end
  return run(self, "all_gather", opts, function(gid) return { gid, src, dst }, 3 end, 2)
end

--- Reduces src (n * numel(dst) elements) over the members and leaves block
-- i of the result in member i's dst. src is not modified. Returns a Future of nil.
function methods:reduce_scatter(src, dst, op, opts)
  if on_gpu(src) then return self:gpu_reduce_scatter(src, dst, op, opts) end -- NCCL for GPU tensors
  op = op or "sum"
  check_tensor(src, "reduce_scatter", "src", 2)
  check_tensor(dst, "reduce_scatter", "dst", 2)
  checks.reduce_op(op, "reduce_scatter", 2)
  check_reducible(src, "reduce_scatter", 2)
  opts = checks.collective_opts(opts, "reduce_scatter", 2)
  local n = opts.dim and (self.shape:dim(opts.dim) or error("no dimension named '" .. opts.dim .. "'", 2)) or self:size()
  if dst.dtype ~= src.dtype or src.numel ~= n * dst.numel then
    error(string.format("reduce_scatter: src must be %s with %d x %d = %d elements; it is %s with %d",
      dst.dtype, n, dst.numel, n * dst.numel, src.dtype, src.numel), 2)
  end
  if rawequal(src, dst) and n > 1 then error("reduce_scatter: src and dst must be different tensors", 2) end
  return run(self, "reduce_scatter", opts, function(gid) return { gid, src, dst, op }, 4 end, 2)
end

--- Returns a Future that is done once every member reached the barrier.
function methods:barrier(opts)
  opts = checks.collective_opts(opts, "barrier", 2)
  return run(self, "barrier", opts, function(gid) return { gid }, 1 end, 2)
end

-- Flat 1-based index of a proc given as coordinates or a 0-based position.
local function position(m, at, name)
  if type(at) == "table" then return m.shape:index(at) end
  if type(at) ~= "number" or at < 0 or at >= #m:proc_list() or at ~= math.floor(at) then
    error(string.format("copy: %s %s is neither coordinates nor a position 0..%d", name, tostring(at), m:size() - 1), 3)
  end
  return at + 1
end

--- Copies src on the proc at src_at into dst on the proc at dst_at, directly
-- between the two procs (the bytes never pass through the controller).
-- src_at, dst_at: coordinate tables of this mesh or 0-based positions. The
-- tensors must have the same dtype and number of elements. The destination
-- runs a receive and the source a send, each in its proc's call order.
-- Returns a Future of nil, done when the data has landed.
function methods:copy(src, src_at, dst, dst_at, opts)
  check_tensor(src, "copy", "src", 2)
  check_tensor(dst, "copy", "dst", 2)
  opts = checks.collective_opts(opts, "copy", 2)
  if src.dtype ~= dst.dtype or src.numel ~= dst.numel then
    error(string.format("copy: src is %s with %d elements but dst is %s with %d", src.dtype, src.numel, dst.dtype,
      dst.numel), 2)
  end
  local all = self:proc_list()
  local sp, dp = all[position(self, src_at, "src_at")], all[position(self, dst_at, "dst_at")]
  local timeout = opts.timeout or self._opts.timeout
  local tag = new_id()
  mesh.before_call()
  local function submit(p, kernel, args, nargs)
    return runtime.submit({ p }, kernel, args, nargs, { mode = "one", timeout = timeout, what = "copy" }).future
  end
  local fs, fr
  if sp == dp then
    fs = submit(sp, "__coll_send", { src, "local", tag }, 3)
    fr = submit(dp, "__coll_recv", { dst, tag }, 2)
  else
    ensure_addrs({ dp })
    fr = submit(dp, "__coll_recv", { dst, tag }, 2)
    fs = submit(sp, "__coll_send", { src, dp._coll_addr, tag }, 3)
  end
  return combine({ fr, fs }, "copy")
end

--- Sets up fresh groups for this mesh (with opts.dim) and returns their ids,
-- one per group, without caching them: for driving the raw __coll_ built-ins
-- (tests, debugging). The caller keeps every member in step.
function M.setup_groups(m, opts)
  opts = checks.collective_opts(opts, "setup_groups", 2)
  local ids, all = {}, m:proc_list()
  for i, idx in ipairs((partition(m, opts.dim, 2))) do
    local procs = {}
    for k, j in ipairs(idx) do procs[k] = all[j] end
    local g = group_for(procs, opts.timeout or m._opts.timeout, true)
    for _, f in ipairs(g.setup) do f:get() end
    ids[i] = g.id
  end
  return ids
end

--- A fresh group of these procs (in this order) on which nothing is ever
-- sent: each member's links to the others tell it at once when one dies
-- (gpu.lua hands it to NCCL communicators, which do not notice on their
-- own). Returns its id once every member has joined.
function M.watch_group(procs, timeout)
  local g = group_for(procs, timeout, true)
  for _, f in ipairs(g.setup) do f:get() end
  return g.id
end

-- ---- groups for kernels ----------------------------------------------------------------

local Group = {}
Group.__index = Group

local function mesh_key(procs)
  local parts = {}
  for i, p in ipairs(procs) do parts[i] = incarnation(p) end
  return table.concat(parts, ",")
end

local GROUP_OPTIONS = { dim = { string = true, table = true }, timeout = "number", gpu = "boolean" }

--- A group of this mesh's procs (with opts.dim: one per line of procs
-- along that dimension, all under one id) for kernels to run collectives
-- on: pass it to ProcMesh:call for a kernel's 'g' argument, and the kernel
-- calls mk_all_reduce etc. on it (docs/kernels.md). Blocks until every
-- member has joined. A call carrying the group that fails tears it down on
-- every member; later calls with it raise (make a new one).
-- opts: {dim = name or {names}, timeout = s, gpu = true}; several dims make
-- one group per position of the others (members row-major in the listed
-- order: {"hosts", "dp"} is data parallel across hosts). With gpu = true the group
-- also gets an NCCL communicator per line (docs/gpu.md), and kernels run
-- its collectives on GPU tensors through NCCL (CPU tensors are refused on
-- it). Returns a Group: id, size (members per group), dim, gpu;
-- group:free() forgets it (and its communicators) on the procs.
function methods:group(opts)
  if opts ~= nil and type(opts) ~= "table" then error("group: options must be a table like {dim = 'dp'}", 2) end
  for k, v in pairs(opts or {}) do
    if not GROUP_OPTIONS[k] then error("group: unknown option '" .. tostring(k) .. "' (known: dim, timeout, gpu)", 2) end
    local want = GROUP_OPTIONS[k]
    if type(want) == "table" and not want[type(v)] then
      error("group: option " .. k .. " wants a dimension's name or a list of names", 2)
    elseif type(want) == "string" and type(v) ~= want then
      error("group: option " .. k .. " wants a " .. want, 2)
    end
  end
  opts = opts or {}
  local parts, size = partition(self, opts.dim, 2)
  local timeout = opts.timeout or self._opts.timeout
  local all = self:proc_list()
  ensure_addrs(all)
  local id, futs = new_id(), {}
  for _, idx in ipairs(parts) do
    local addrs, ranks = {}, {}
    for k, i in ipairs(idx) do addrs[k], ranks[k] = all[i]._coll_addr, all[i].rank end
    for k, i in ipairs(idx) do
      futs[#futs + 1] = runtime.submit({ all[i] }, "__coll_group", { id, k - 1, addrs, ranks }, 4,
        { mode = "one", timeout = timeout, what = "kernel group setup" }).future
    end
  end
  combine(futs, "kernel group setup"):get()
  if opts.gpu then
    -- The communicators take the group's id: a kernel's collective finds its group's communicator by it.
    local ok, err = pcall(self._gpu_group_comms, self, parts, id, 1)
    if not ok then
      self:_submit("__coll_free", { id }, 1, { what = "group free" }):get()
      error(err, 2)
    end
  end
  local dim = type(opts.dim) == "table" and table.concat(opts.dim, ",") or opts.dim
  return setmetatable({ __mn_group = id, id = id, size = size, dim = dim, gpu = opts.gpu == true,
    _key = mesh_key(all), _mesh = self }, Group)
end

function Group:__tostring()
  return string.format("Group(%d, %d members%s%s%s)", self.id, self.size, self.dim and " along " .. self.dim or "",
    self.gpu and ", gpu" or "", self._dead and ", torn down" or "")
end

--[[ For ProcMesh:call: the id to send for this group on mesh m, and a
  function that turns the call's Future into one that fails with the most
  telling member's error (not an echo of it) and marks the group torn down. ]]
function Group:_bind(m, level)
  if self._freed then error(tostring(self) .. " was freed", level + 1) end
  if self._dead then
    error(tostring(self) .. ": a failed call tore it down on its procs; make a new one with mesh:group()", level + 1)
  end
  if mesh_key(m:proc_list()) ~= self._key then
    error(tostring(self) .. " belongs to another mesh (or one of its procs was restarted): call the kernel on the mesh " ..
      "the group was made on", level + 1)
  end
  local g = self
  return self.id, function(fut)
    local f = future.new(fut.what)
    f.source = fut -- cancelling f cancels the call
    fut:on_done(function(d)
      local ok, v = d:result()
      if ok then return f:resolve(v) end
      g._dead = true
      local best = errors.is(v) and v.failures and best_error(v.failures) or v
      if errors.is(best) and best ~= v then
        best.failures, best.others = v.failures, v.others
      end
      f:fail(best)
    end)
    return f
  end
end

--- Forgets the group on its procs (blocking). The group cannot be used afterwards.
function Group:free()
  if self._freed then return end
  self._freed = true
  local m = self._mesh
  if self.gpu then
    -- A failed call dropped the communicators on the procs it reached; release any the others still hold.
    local ok, err = pcall(m._gpu_free_group_comms, m, self.id)
    if not ok and not self._dead then error(err, 2) end
  end
  if self._dead then return end
  m:_submit("__coll_free", { self.id }, 1, { what = "group free" }):get()
end

--- Whether v is a Group (from ProcMesh:group).
function M.is_group(v) return getmetatable(v) == Group end

--- Forgets every cached group (the next collective sets new ones up).
function M.forget_groups() groups = {} end

mesh.provide("monarch.collective", methods)
return M
