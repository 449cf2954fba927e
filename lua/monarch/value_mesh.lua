--- ValueMesh: one value per proc of a mesh, addressed by coordinates.
--   vm:get{procs = 1}   vm:get(0, 1)   vm[2] (flat, 1-based)
--   for coords, v in vm:items() do ... end      vm:values()
-- Values sit at the table's own integer keys, so ipairs(vm) and #vm work
-- when no value is nil; vm:size() is always right.
local M = {}

local methods = {}
local ValueMesh = {}

ValueMesh.__index = methods

--- Makes a ValueMesh over `shape` from a flat list of n values (nil allowed).
-- Takes ownership of `values`.
function M.new(shape, values, n)
  values.shape = shape
  values._n = n or shape:size()
  return setmetatable(values, ValueMesh)
end

--- Number of values.
function methods:size() return self._n end

--- Value at coordinates: a table {dim = i} or positional integers.
function methods:get(...)
  local c = ...
  if type(c) ~= "table" then c = { ... } end
  return self[self.shape:index(c)]
end

--- Iterates (coords, value) in rank order.
function methods:items()
  local i = 0
  return function()
    i = i + 1
    if i <= self._n then return self.shape:coords(i), self[i] end
  end
end

--- A plain Lua array of the values, in rank order.
function methods:values()
  local out = {}
  for i = 1, self._n do out[i] = self[i] end
  return out
end

--- Applies fn to every value; returns a new ValueMesh of the results.
function methods:map(fn)
  local out = {}
  for i = 1, self._n do out[i] = fn(self[i], self.shape:coords(i)) end
  return M.new(self.shape, out, self._n)
end

local function show(v)
  if type(v) == "string" then return string.format("%q", #v > 40 and v:sub(1, 37) .. "..." or v) end
  if type(v) == "table" and getmetatable(v) == nil then
    local parts = {}
    for i = 1, math.min(#v, 8) do parts[i] = show(v[i]) end
    if #v > 8 then parts[#parts + 1] = "..." end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  return tostring(v)
end

ValueMesh.__tostring = function(vm)
  local parts = {}
  local limit = 16
  for i = 1, math.min(vm._n, limit) do
    local c = vm.shape:coords(i)
    local cs = {}
    for d, name in ipairs(vm.shape.names) do cs[d] = name .. "=" .. c[name] end
    parts[#parts + 1] = "  [" .. table.concat(cs, ",") .. "] " .. show(vm[i])
  end
  if vm._n > limit then parts[#parts + 1] = string.format("  ... (%d more)", vm._n - limit) end
  return "ValueMesh" .. tostring(vm.shape) .. "\n" .. table.concat(parts, "\n")
end

--- True if v is a ValueMesh.
function M.is(v) return getmetatable(v) == ValueMesh end

M.ValueMesh = ValueMesh
return M
