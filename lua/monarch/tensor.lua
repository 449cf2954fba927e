--- Remote tensors (they live on the procs) and host tensors (fetched copies).
--   local t = mesh:tensor("f32", {1024})    -- one per proc, zeroed
--   mesh:call("fill", t, 0.5)               -- passed to kernels by handle
--   local vm = t:fetch():get()              -- ValueMesh of HostTensor
--   vm[1][1], vm[1]:totable(), t:free()     -- or let the GC free it
local ffi = require "ffi"
local bulk = require "monarch.bulk"
local checks = require "monarch.checks"
local core = require "monarch.core"
local errors = require "monarch.errors"
local future = require "monarch.future"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local value_mesh = require "monarch.value_mesh"

local M = {}

M.dtypes = checks.DTYPES -- name -> {ctype, size}

-- ---- host tensors ------------------------------------------------------------

local HostTensor = {}
local host_methods = {}
-- f16 and bf16 are stored as raw 16-bit patterns; reads convert them to numbers.
local function half_to_number(h)
  local sign = bit.band(h, 0x8000) ~= 0 and -1 or 1
  local e, m = bit.band(bit.rshift(h, 10), 0x1f), bit.band(h, 0x3ff)
  if e == 0 then return sign * m * 2 ^ -24 end
  if e == 31 then return m == 0 and sign * math.huge or 0 / 0 end
  return sign * (1 + m / 1024) * 2 ^ (e - 15)
end

local bf16_buf = ffi.new("union { uint32_t u; float f; }")
local function bf16_to_number(h)
  bf16_buf.u = bit.lshift(h, 16)
  return tonumber(bf16_buf.f)
end

local function read(t, i)
  local v = t.data[i]
  if t.dtype == "f16" then return half_to_number(v) end
  if t.dtype == "bf16" then return bf16_to_number(v) end
  return tonumber(v) -- i64 beyond 2^53 loses precision here; read t.data for exact values
end

local function check_index(t, k)
  if type(k) ~= "number" or k < 1 or k > t.numel or k ~= math.floor(k) then
    error(string.format("host tensor index %s is outside 1..%d", tostring(k), t.numel), 3)
  end
end

HostTensor.__index = function(t, k)
  if type(k) == "number" then
    check_index(t, k)
    return read(t, k - 1)
  end
  return host_methods[k]
end
HostTensor.__newindex = function(t, k, v)
  check_index(t, k)
  t.data[k - 1] = v
end

local numel_of = checks.numel

ffi.cdef [[ void *malloc(size_t); void free(void *); ]]

--- Makes a host tensor; bytes (a string) fills it if given. `uninit` skips
-- zeroing (for a tensor about to be overwritten whole, like a fetch's).
-- A big one (monarch.bulk.SHARED_MIN) lives in shared memory that a proc
-- on this host copies at memcpy's speed; it comes zeroed all the same.
function M.host(dtype, shape, bytes, uninit)
  local d = checks.dtype(dtype, 2)
  if type(shape) == "number" then shape = { shape } end
  local n = numel_of(shape)
  local data, fd
  if n * d.size >= bulk.SHARED_MIN then data, fd = bulk.shared(d.ctype, n * d.size) end -- zero-filled
  if data == nil and uninit and n * d.size >= 65536 then
    -- Big and about to be overwritten: malloc, not ffi.new's zero-filling pass.
    local p = ffi.C.malloc(n * d.size)
    if p == nil then error(string.format("out of memory for a %d-byte host tensor", n * d.size), 2) end
    data = ffi.gc(ffi.cast(d.ctype .. "*", p), ffi.C.free)
  elseif data == nil then
    data = ffi.new(d.ctype .. "[?]", math.max(n, 1))
  end
  if bytes then
    if #bytes ~= n * d.size then
      error(string.format("host tensor of %d bytes built from %d bytes", n * d.size, #bytes), 2)
    end
    ffi.copy(data, bytes, #bytes)
  end
  return setmetatable({ dtype = dtype, shape = shape, numel = n, data = data, _fd = fd }, HostTensor)
end

--- The values as a Lua array.
function host_methods:totable()
  local out = {}
  for i = 0, self.numel - 1 do out[i + 1] = read(self, i) end
  return out
end

--- The raw bytes.
function host_methods:bytes()
  return ffi.string(self.data, self.numel * M.dtypes[self.dtype].size)
end

HostTensor.__tostring = function(t)
  local parts = {}
  for i = 0, math.min(t.numel, 8) - 1 do parts[#parts + 1] = string.format("%.6g", read(t, i)) end
  if t.numel > 8 then parts[#parts + 1] = "..." end
  return string.format("HostTensor(%s, {%s}) [%s]", t.dtype, table.concat(t.shape, ","), table.concat(parts, ", "))
end

-- ---- remote tensors ----------------------------------------------------------

local Tensor = {}
Tensor.__index = Tensor
local next_id = 0
local to_free = {} -- { procs, id } queued by the GC, sent by flush_frees

--- Sends the frees the garbage collector queued. Every mesh verb runs it first (mesh.on_before_call).
function M.flush_frees()
  if #to_free == 0 then return end
  local batch = to_free
  to_free = {}
  for _, f in ipairs(batch) do
    -- Only procs that still hold it: a dead or stopped proc took its tensors along.
    local live = {}
    for _, p in ipairs(f[1]) do
      if p.tensors then p.tensors[f[2]] = nil end
      if p.state ~= "dead" and p.state ~= "stopped" then live[#live + 1] = p end
    end
    if #live > 0 then runtime.submit(live, "__tensor_free", { f[2] }, 1, { mode = "broadcast" }) end
  end
end

--- Creates a zeroed tensor on every proc of mesh. shape: a list of sizes or one number.
function M.new(mesh, dtype, shape)
  shape = checks.tensor_spec(dtype, shape, 3)
  next_id = next_id + 1
  local id = next_id
  local procs = mesh:proc_list()
  local t = setmetatable({ __mn_tensor = id, dtype = dtype, shape = shape, numel = numel_of(shape), mesh = mesh }, Tensor)
  runtime.submit(procs, "__tensor_new", { id, dtype, shape }, 3, { mode = "broadcast" })
  -- Procs remember their tensors so a restart can re-create them.
  local spec = { dtype = dtype, shape = shape }
  for _, p in ipairs(procs) do
    p.tensors = p.tensors or {}
    p.tensors[id] = spec
  end
  local proxy = newproxy(true)
  getmetatable(proxy).__gc = function() to_free[#to_free + 1] = { procs, id } end
  rawset(t, "_gc", proxy)
  return t
end

--- A handle for a tensor that already exists on the mesh's procs (a
-- re-attached persistent mesh): not created, not freed by the GC.
function M.adopt(mesh, id, dtype, shape)
  if id > next_id then next_id = id end
  return setmetatable({ __mn_tensor = id, dtype = dtype, shape = shape, numel = numel_of(shape), mesh = mesh,
    _gc = newproxy(true) }, Tensor)
end

local function check_live(t)
  if rawget(t, "freed") then error("tensor " .. t.__mn_tensor .. " was freed", 3) end
end

--- The same tensor seen from `mesh`, whose procs must all hold it: a part of
-- its own mesh, such as mesh:survivors(). Calls, fetch and put on the view
-- reach only mesh's procs. The view keeps the original handle alive, and
-- the original (not the view) frees the tensor.
function Tensor:on(mesh)
  check_live(self)
  local holds = {}
  for _, p in ipairs(self.mesh:proc_list()) do holds[p] = true end
  for _, p in ipairs(mesh:proc_list()) do
    if not holds[p] then
      error(string.format("tensor:on: rank %d is not one of the procs that hold tensor %d", p.rank, self.__mn_tensor), 2)
    end
  end
  local v = M.adopt(mesh, self.__mn_tensor, self.dtype, self.shape)
  rawset(v, "_owner", rawget(self, "_owner") or self)
  return v
end

--- Bytes per bulk message: big tensors stream in chunks of this size, so
-- neither side ever holds a second copy of the whole tensor.
M.CHUNK = 4 * 1024 * 1024

local function address(cdata) return tonumber(ffi.cast("uintptr_t", cdata)) end

-- A future done when every future in futs is, failing with the first error.
local function all_of(futs, what, value)
  local f = future.new(what)
  local left = #futs
  if left == 0 then f:resolve(value) end
  for _, x in ipairs(futs) do
    x:on_done(function(d)
      local ok, err = d:result()
      if not ok then return f:fail(err) end
      left = left - 1
      if left == 0 then f:resolve(value) end
    end)
  end
  return f
end

--- Fetches every proc's copy: Future of a ValueMesh of HostTensor. Big
-- tensors come in M.CHUNK pieces that land in place in the host tensors.
-- `into` (a ValueMesh or list of HostTensors, one per proc, of the same
-- byte size) reuses memory: fresh pages cost more than the copy itself.
-- A proc on this host writes into them itself (monarch.bulk).
function Tensor:fetch(into)
  check_live(self)
  local procs, n = self.mesh:proc_list(), #self.mesh:proc_list()
  local nbytes = self.numel * M.dtypes[self.dtype].size
  local hosts = {}
  for i = 1, n do
    local h = into and into[i]
    if into and (getmetatable(h) ~= HostTensor or h.numel * M.dtypes[h.dtype].size ~= nbytes) then
      error(string.format("fetch into: entry %d must be a HostTensor of %d bytes", i, nbytes), 2)
    end
    hosts[i] = h or M.host(self.dtype, self.shape)
  end
  local here = bulk.local_set(procs)
  local near, near_hosts, far, far_hosts = {}, {}, {}, {}
  for i, p in ipairs(procs) do
    if here[p] then near[#near + 1], near_hosts[#near_hosts + 1] = p, hosts[i]
    else far[#far + 1], far_hosts[#far_hosts + 1] = p, hosts[i] end
  end
  local futs = {}
  self:_fetch_local(near, near_hosts, nbytes, futs)
  self:_fetch_tcp(far, far_hosts, nbytes, futs)
  return all_of(futs, "fetch of tensor " .. self.__mn_tensor, value_mesh.new(self.mesh.shape, hosts, n))
end

-- Fetches over the procs' sockets into hosts (one per proc), adding a future per chunk to futs.
function Tensor:_fetch_tcp(procs, hosts, nbytes, futs)
  if #procs == 0 then return end
  for off = 0, nbytes - 1, M.CHUNK do
    local len = math.min(M.CHUNK, nbytes - off)
    local rec = runtime.submit(procs, "__tensor_fetch", { self, off, len }, 3, {
      what = "fetch of tensor " .. self.__mn_tensor, make_result = function(v) return v end,
    })
    if not rec.done then
      for i = 1, #procs do core.fetch_into(rec.id, i, address(hosts[i].data) + off, len) end
    end
    futs[#futs + 1] = rec.future
    bulk.stats.tcp_fetches, bulk.stats.tcp_bytes = bulk.stats.tcp_fetches + 1, bulk.stats.tcp_bytes + len * #procs
  end
end

-- Has procs on this host write into hosts themselves (__bulk_fetch), a future per chunk into futs.
function Tensor:_fetch_local(procs, hosts, nbytes, futs)
  if #procs == 0 then return end
  for off = 0, nbytes - 1, bulk.CHUNK do
    local len = math.min(bulk.CHUNK, nbytes - off)
    local addrs = {}
    for i = 1, #procs do addrs[i] = address(hosts[i].data) + off end
    local rec = bulk.submit("__bulk_fetch", procs, self, off, len, addrs, hosts, "fetch of tensor " .. self.__mn_tensor)
    futs[#futs + 1] = rec.future
    bulk.stats.local_fetches, bulk.stats.local_bytes = bulk.stats.local_fetches + 1, bulk.stats.local_bytes + len * #procs
  end
end

-- The bytes to send for `values` (a Lua array of numbers, a HostTensor or a
-- byte string): returns src (a string or an address) and the owner that
-- keeps an address alive. `level` points errors at the caller.
function Tensor:_source(values, level)
  local nbytes = self.numel * M.dtypes[self.dtype].size
  local bytes = values
  if type(values) == "table" then
    if getmetatable(values) == HostTensor then
      if values.numel * M.dtypes[values.dtype].size ~= nbytes then
        error(string.format("put of a %d-byte HostTensor into a tensor of %d bytes", values.numel * M.dtypes[values.dtype].size, nbytes), level + 1)
      end
      return address(values.data), values -- straight from its memory
    end
    if #values ~= self.numel then
      error(string.format("put of %d values into a tensor of %d", #values, self.numel), level + 1)
    end
    local h = M.host(self.dtype, self.shape)
    for i = 1, #values do h.data[i - 1] = values[i] end
    bytes = h:bytes()
  end
  if type(bytes) ~= "string" then error("put wants a table, a HostTensor or a string", level + 1) end
  if #bytes ~= nbytes then error(string.format("put of %d bytes into a tensor of %d bytes", #bytes, nbytes), level + 1) end
  return bytes, nil
end

--- Writes the same values (a Lua array, a HostTensor or a byte string) to every proc's copy.
-- Returns a Future that is done when all procs have them.
function Tensor:put(values)
  check_live(self)
  local src, owner = self:_source(values, 2)
  return self:_put_bytes(src, 0, self.numel * M.dtypes[self.dtype].size, owner, self.mesh:proc_list())
end

--- Writes a different value to each proc's copy: values[i] (as for put) goes
-- to the i-th proc of the mesh in rank order (values may be a ValueMesh).
-- Returns a Future that is done when all procs have theirs.
function Tensor:scatter(values)
  check_live(self)
  local procs = self.mesh:proc_list()
  if type(values) ~= "table" or (values._n or #values) ~= #procs then
    error(string.format("scatter wants one value per proc (%d)", #procs), 2)
  end
  local futs = {}
  for i, p in ipairs(procs) do
    local src, owner = self:_source(values[i], 2)
    futs[i] = self:_put_bytes(src, 0, self.numel * M.dtypes[self.dtype].size, owner, { p })
  end
  return all_of(futs, "scatter into tensor " .. self.__mn_tensor, nil)
end

-- Streams nbytes from src (a string, or an address kept alive by owner) in
-- chunks written straight from that memory to each of procs; procs on this
-- host copy it out of our memory themselves (monarch.bulk).
function Tensor:_put_bytes(src, base, nbytes, owner, procs)
  for _, p in ipairs(procs) do
    if p.state ~= "ready" then
      error(errors.new { kind = "proc_failed", rank = p.rank, host = p.host, pid = p.pid,
        message = "put needs every proc ready; this one is " .. p.state }, 3)
    end
  end
  local here = bulk.local_set(procs)
  local near, far = {}, {}
  for _, p in ipairs(procs) do
    if here[p] then near[#near + 1] = p else far[#far + 1] = p end
  end
  local futs = {}
  if #near > 0 then
    -- A string's bytes stay where they are while the string lives: hold it.
    local at = type(src) == "string" and address(ffi.cast("const char *", src)) or src
    self:_put_local(at + base, nbytes, type(src) == "string" and src or owner, near, futs)
  end
  if #far > 0 then self:_put_tcp(src, base, nbytes, owner, far, futs) end
  return all_of(futs, "put of tensor " .. self.__mn_tensor, nil)
end

--- Seconds a put waits for its procs' direct links (a large mesh's procs open theirs on demand).
M.LINK_WAIT = 30

-- Waits until a put may go on each of procs' own links (conns `targets`): no call still on its way
-- through their host agents, and a pooled proc's link open (core.unlinked asks for it). A proc that
-- is no longer live ends the wait: the put then reports it.
local function await_links(procs, targets)
  local deadline = runtime.now() + M.LINK_WAIT
  while core.relayed(targets) > 0 or core.unlinked(targets) > 0 do
    for _, p in ipairs(procs) do
      if p.state ~= "ready" and p.state ~= "reconnecting" then return end
    end
    if runtime.now() > deadline then
      error(errors.new { kind = "timeout",
        message = "a put waited " .. M.LINK_WAIT .. "s for its procs' direct links" }, 0)
    end
    runtime.pump(0.005)
  end
end

-- Queues the chunks of a put over the procs' sockets, a future per chunk into futs. The pool of
-- direct links (monarch.configure{direct_max}) takes half a pool's worth of procs at a time: links
-- busy elsewhere (a call_one running, a handshake) must not leave a group that can never be up at once.
function Tensor:_put_tcp(src, base, nbytes, owner, procs, futs)
  local group = math.max(1, math.floor(core.cast_stats().direct_max / 2))
  for first = 1, #procs, group do
    local part, targets = {}, {}
    for i = first, math.min(first + group - 1, #procs) do
      part[#part + 1], targets[#targets + 1] = procs[i], procs[i].conn
    end
    await_links(part, targets)
    for off = 0, math.max(nbytes - 1, 0), M.CHUNK do
      local len = math.min(M.CHUNK, nbytes - off)
      local rec = runtime.submit_custom(part, "__tensor_put", function(id)
        return core.put_chunk(id, targets, self.__mn_tensor, off, src, base + off, len, owner)
      end)
      futs[#futs + 1] = rec.future
      bulk.stats.tcp_puts, bulk.stats.tcp_bytes = bulk.stats.tcp_puts + 1, bulk.stats.tcp_bytes + len * #part
    end
  end
end

-- Has procs on this host copy nbytes at address `at` (kept alive by owner) themselves (__bulk_put).
function Tensor:_put_local(at, nbytes, owner, procs, futs)
  local holds = {}
  for i = 1, #procs do holds[i] = owner end
  for off = 0, math.max(nbytes - 1, 0), bulk.CHUNK do
    local len = math.min(bulk.CHUNK, nbytes - off)
    local addrs = {}
    for i = 1, #procs do addrs[i] = at + off end
    local rec = bulk.submit("__bulk_put", procs, self, off, len, addrs, holds, "put of tensor " .. self.__mn_tensor)
    futs[#futs + 1] = rec.future
    bulk.stats.local_puts, bulk.stats.local_bytes = bulk.stats.local_puts + 1, bulk.stats.local_bytes + len * #procs
  end
end

--- Frees the tensor on every proc now (instead of when collected).
function Tensor:free()
  if rawget(self, "freed") then return end
  rawset(self, "freed", true)
  getmetatable(rawget(self, "_gc")).__gc = nil
  for _, p in ipairs(self.mesh:proc_list()) do if p.tensors then p.tensors[self.__mn_tensor] = nil end end
  runtime.submit(self.mesh:proc_list(), "__tensor_free", { self.__mn_tensor }, 1, { mode = "broadcast" })
end

-- The procs of list as a set.
local function set_of(list)
  local s = {}
  for _, p in ipairs(list) do s[p] = true end
  return s
end

-- The proc of t's mesh to copy from: rank `from`, or the first ready one.
local function source_proc(t, from, level)
  for _, p in ipairs(t.mesh:proc_list()) do
    if (from == nil and p.state == "ready") or (from ~= nil and p.rank == from) then
      if p.state ~= "ready" then
        error(errors.new { kind = "proc_failed", rank = p.rank, host = p.host, pid = p.pid,
          message = "copy_from_peer: the source proc is " .. p.state }, level + 1)
      end
      return p
    end
  end
  if from ~= nil then error("copy_from_peer: no proc of rank " .. tostring(from) .. " holds tensor " .. t.__mn_tensor, level + 1) end
  error(errors.new { kind = "proc_failed",
    message = "copy_from_peer: no ready proc holds tensor " .. t.__mn_tensor }, level + 1)
end

--- Makes this tensor live on every proc of mesh `m`, which holds all of
-- the tensor's procs (as the mesh ProcMesh:grow returns does): each proc
-- of m that did not hold it gets it, filled with a healthy proc's copy.
-- The bytes go proc to proc (one collective broadcast over the source and
-- the new procs); the controller never holds them. opts: from = the rank
-- of the proc to copy from (default the first ready one that holds it),
-- timeout = seconds. From now on t.mesh is m, so fetch, put, free and
-- the garbage collector reach the new copies too. Returns a Future of nil,
-- done when every new copy has the bytes.
function Tensor:copy_from_peer(m, opts)
  check_live(self)
  if getmetatable(m) ~= mesh_mod.ProcMesh then error("copy_from_peer wants a ProcMesh", 2) end
  opts = opts or {}
  for k, v in pairs(opts) do
    if (k ~= "from" and k ~= "timeout") or type(v) ~= "number" then
      error("copy_from_peer: option " .. tostring(k) .. " is unknown or not a number (known: from, timeout)", 2)
    end
  end
  local holds, in_m = set_of(self.mesh:proc_list()), set_of(m:proc_list())
  for _, p in ipairs(self.mesh:proc_list()) do
    if not in_m[p] then
      error(string.format("copy_from_peer: the mesh lacks rank %d, which holds tensor %d: pass a mesh grown from its own",
        p.rank, self.__mn_tensor), 2)
    end
  end
  local new = {}
  for _, p in ipairs(m:proc_list()) do if not holds[p] then new[#new + 1] = p end end
  local src = source_proc(self, opts.from, 2)
  rawset(self, "mesh", m)
  if #new == 0 then
    local f = future.new("copy_from_peer of tensor " .. self.__mn_tensor)
    f:resolve(nil)
    return f
  end
  local id, spec = self.__mn_tensor, { dtype = self.dtype, shape = self.shape }
  runtime.submit(new, "__tensor_new", { id, self.dtype, self.shape }, 3, { mode = "broadcast" })
  for _, p in ipairs(new) do
    p.tensors = p.tensors or {}
    p.tensors[id] = spec
  end
  local gc = getmetatable(rawget(self, "_gc"))
  if gc.__gc then -- the GC frees it on the procs of m now (an adopted tensor is never freed by it)
    gc.__gc = nil
    local proxy, procs = newproxy(true), m:proc_list()
    getmetatable(proxy).__gc = function() to_free[#to_free + 1] = { procs, id } end
    rawset(self, "_gc", proxy)
  end
  local members = { src }
  for _, p in ipairs(new) do members[#members + 1] = p end
  local group = mesh_mod.flat(members)
  return group:broadcast_tensor(self, 0, opts.timeout and { timeout = opts.timeout } or nil)
end

Tensor.__tostring = function(t)
  return string.format("Tensor(%d, %s, {%s}) on %d procs", t.__mn_tensor, t.dtype, table.concat(t.shape, ","),
    #t.mesh:proc_list())
end

--- ProcMesh:tensor(dtype, shape): a tensor of dtype and shape on every proc of this mesh (zeroed).
mesh_mod.provide("monarch.tensor", { tensor = function(self, dtype, shape) return M.new(self, dtype, shape) end })
mesh_mod.on_before_call(M.flush_frees)

function M.is(v) return getmetatable(v) == Tensor end
function M.is_host(v) return getmetatable(v) == HostTensor end

M.Tensor, M.HostTensor = Tensor, HostTensor
M.value_mesh = value_mesh
return M
