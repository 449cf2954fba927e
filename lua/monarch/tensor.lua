--- Remote tensors (they live on the procs) and host tensors (fetched copies).
--   local t = mesh:tensor("f32", {1024})    -- one per proc, zeroed
--   mesh:call("fill", t, 0.5)               -- passed to kernels by handle
--   local vm = t:fetch():get()              -- ValueMesh of HostTensor
--   vm[1][1], vm[1]:totable(), t:free()     -- or let the GC free it
local ffi = require "ffi"
local runtime = require "monarch.runtime"
local value_mesh = require "monarch.value_mesh"

local M = {}

M.dtypes = {
  f32 = { ctype = "float", size = 4 }, f64 = { ctype = "double", size = 8 },
  f16 = { ctype = "uint16_t", size = 2 }, bf16 = { ctype = "uint16_t", size = 2 },
  i32 = { ctype = "int32_t", size = 4 }, i64 = { ctype = "int64_t", size = 8 },
  u8 = { ctype = "uint8_t", size = 1 },
}

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

local function numel_of(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

--- Makes a host tensor; bytes (a string) fills it if given.
function M.host(dtype, shape, bytes)
  local d = M.dtypes[dtype] or error("unknown dtype '" .. tostring(dtype) .. "'", 2)
  if type(shape) == "number" then shape = { shape } end
  local n = numel_of(shape)
  local data = ffi.new(d.ctype .. "[?]", math.max(n, 1))
  if bytes then
    if #bytes ~= n * d.size then
      error(string.format("host tensor of %d bytes built from %d bytes", n * d.size, #bytes), 2)
    end
    ffi.copy(data, bytes, #bytes)
  end
  return setmetatable({ dtype = dtype, shape = shape, numel = n, data = data }, HostTensor)
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

--- Sends the frees the garbage collector queued. Called by the runtime.
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
  if not M.dtypes[dtype] then
    error("unknown dtype '" .. tostring(dtype) .. "' (f32, f64, f16, bf16, i32, i64, u8)", 3)
  end
  if type(shape) == "number" then shape = { shape } end
  if type(shape) ~= "table" or #shape > 8 then error("tensor shape must be a list of up to 8 sizes", 3) end
  for i, s in ipairs(shape) do
    if type(s) ~= "number" or s < 0 or s ~= math.floor(s) then
      error(string.format("tensor shape entry %d must be a non-negative integer, got %s", i, tostring(s)), 3)
    end
  end
  next_id = next_id + 1
  local id = next_id
  local procs = mesh._procs
  local t = setmetatable({ __mn_tensor = id, dtype = dtype, shape = shape, numel = numel_of(shape), mesh = mesh }, Tensor)
  runtime.submit(procs, "__tensor_new", { id, dtype, shape }, 3, { mode = "broadcast" })
  -- Procs remember their tensors so a restart can re-create them.
  local spec = { dtype = dtype, shape = shape }
  for _, p in ipairs(procs) do if p.tensors then p.tensors[id] = spec end end
  local proxy = newproxy(true)
  getmetatable(proxy).__gc = function() to_free[#to_free + 1] = { procs, id } end
  rawset(t, "_gc", proxy)
  return t
end

local function check_live(t)
  if rawget(t, "freed") then error("tensor " .. t.__mn_tensor .. " was freed", 3) end
end

--- Fetches every proc's copy: Future of a ValueMesh of HostTensor.
function Tensor:fetch()
  check_live(self)
  local dtype, shape = self.dtype, self.shape
  return self.mesh:_submit("__tensor_fetch", { self }, 1, {
    what = "fetch of tensor " .. self.__mn_tensor,
    convert = function(bytes) return M.host(dtype, shape, bytes) end,
  })
end

--- Writes the same values (a Lua array, a HostTensor or a byte string) to every proc's copy.
-- Returns a Future that is done when all procs have them.
function Tensor:put(values)
  check_live(self)
  local bytes = values
  if type(values) == "table" then
    if getmetatable(values) == HostTensor then
      bytes = values:bytes()
    else
      if #values ~= self.numel then
        error(string.format("put of %d values into a tensor of %d", #values, self.numel), 2)
      end
      local h = M.host(self.dtype, self.shape)
      for i = 1, #values do h.data[i - 1] = values[i] end
      bytes = h:bytes()
    end
  end
  if type(bytes) ~= "string" then error("put wants a table, a HostTensor or a string", 2) end
  return self.mesh:call("__tensor_put", self, bytes)
end

--- Frees the tensor on every proc now (instead of when collected).
function Tensor:free()
  if rawget(self, "freed") then return end
  rawset(self, "freed", true)
  getmetatable(rawget(self, "_gc")).__gc = nil
  for _, p in ipairs(self.mesh._procs) do if p.tensors then p.tensors[self.__mn_tensor] = nil end end
  runtime.submit(self.mesh._procs, "__tensor_free", { self.__mn_tensor }, 1, { mode = "broadcast" })
end

Tensor.__tostring = function(t)
  return string.format("Tensor(%d, %s, {%s}) on %d procs", t.__mn_tensor, t.dtype, table.concat(t.shape, ","),
    #t.mesh._procs)
end

function M.is(v) return getmetatable(v) == Tensor end
function M.is_host(v) return getmetatable(v) == HostTensor end

M.Tensor, M.HostTensor = Tensor, HostTensor
M.value_mesh = value_mesh
return M
