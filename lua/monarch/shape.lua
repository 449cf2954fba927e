--- Shape: ordered named dimensions, and the arithmetic of meshes over them.
-- Coordinates are 0-based, like ranks; flat indices are 1-based, like Lua.
local M = {}

local Shape = {}
Shape.__index = Shape

--- Makes a shape from parallel lists of names and sizes.
function M.new(names, sizes)
  assert(#names == #sizes, "shape: names and sizes differ in length")
  local seen = {}
  for i, n in ipairs(names) do
    if type(n) ~= "string" then error("shape: dimension " .. i .. " has a non-string name", 2) end
    if seen[n] then error("shape: dimension '" .. n .. "' appears twice", 2) end
    seen[n] = true
    local s = sizes[i]
    if type(s) ~= "number" or s < 1 or s ~= math.floor(s) then
      error("shape: dimension '" .. n .. "' needs a positive integer size, got " .. tostring(s), 2)
    end
  end
  local n, z = {}, {}
  for i = 1, #names do n[i], z[i] = names[i], sizes[i] end
  return setmetatable({ names = n, sizes = z }, Shape)
end

--- Number of elements.
function Shape:size()
  local n = 1
  for _, s in ipairs(self.sizes) do n = n * s end
  return n
end

--- Size of one named dimension, or nil.
function Shape:dim(name)
  for i, n in ipairs(self.names) do
    if n == name then return self.sizes[i], i end
  end
end

--- Flat 1-based index of a coordinate given as {name = i} or a positional list.
function Shape:index(coords)
  local idx, stride = 0, 1
  for d = #self.names, 1, -1 do
    local name = self.names[d]
    local c = coords[name]
    if c == nil then c = coords[d] end
    if c == nil then
      if self.sizes[d] == 1 then c = 0 else error("coordinate for dimension '" .. name .. "' is missing", 3) end
    end
    if type(c) ~= "number" or c < 0 or c >= self.sizes[d] or c ~= math.floor(c) then
      error(string.format("coordinate %s = %s is outside 0..%d", name, tostring(c), self.sizes[d] - 1), 3)
    end
    idx = idx + c * stride
    stride = stride * self.sizes[d]
  end
  for k in pairs(coords) do
    if type(k) == "string" and not self:dim(k) then
      error("no dimension named '" .. k .. "' in " .. tostring(self), 3)
    elseif type(k) == "number" and (k < 1 or k > #self.names) then
      error(string.format("%d coordinates given for a shape of %d dimensions %s", #coords, #self.names, tostring(self)), 3)
    end
  end
  return idx + 1
end

--- Coordinates {name = i} of a flat 1-based index.
function Shape:coords(index)
  if type(index) ~= "number" or index < 1 or index > self:size() or index ~= math.floor(index) then
    error(string.format("flat index %s is outside 1..%d", tostring(index), self:size()), 2)
  end
  local c, rem = {}, index - 1
  for d = #self.names, 1, -1 do
    c[self.names[d]] = rem % self.sizes[d]
    rem = math.floor(rem / self.sizes[d])
  end
  return c
end

--- Applies a slice spec {dim = i | {from, to}} to this shape.
-- An integer keeps one position and drops the dimension; {from, to} keeps
-- positions from..to-1. Returns the new shape and the list of flat indices
-- (into this shape) that it keeps, in order.
function Shape:slice(spec)
  local keep = {}
  for d, name in ipairs(self.names) do
    local s = spec[name]
    local size = self.sizes[d]
    if s == nil then
      keep[d] = { 0, size, false }
    elseif type(s) == "number" then
      if s < 0 or s >= size or s ~= math.floor(s) then
        error(string.format("slice: %s = %s is outside 0..%d", name, tostring(s), size - 1), 3)
      end
      keep[d] = { s, s + 1, true }
    elseif type(s) == "table" then
      local from, to = s[1] or 0, s[2] or size
      if type(from) ~= "number" or type(to) ~= "number" or from ~= math.floor(from) or to ~= math.floor(to)
          or from < 0 or to > size or from >= to then
        error(string.format("slice: %s = {%s, %s} is not a non-empty range within 0..%d", name,
          tostring(s[1]), tostring(s[2]), size), 3)
      end
      keep[d] = { from, to, false }
    else
      error("slice: " .. name .. " wants an integer or {from, to}, got " .. type(s), 3)
    end
  end
  for k in pairs(spec) do
    if not self:dim(k) then error("slice: no dimension named '" .. tostring(k) .. "' in " .. tostring(self), 3) end
  end
  local names, sizes = {}, {}
  for d, name in ipairs(self.names) do
    if not keep[d][3] then
      names[#names + 1] = name
      sizes[#sizes + 1] = keep[d][2] - keep[d][1]
    end
  end
  local out = {}
  local function walk(d, base)
    if d > #self.names then
      out[#out + 1] = base + 1
      return
    end
    local stride = 1
    for e = d + 1, #self.names do stride = stride * self.sizes[e] end
    for i = keep[d][1], keep[d][2] - 1 do walk(d + 1, base + i * stride) end
  end
  walk(1, 0)
  return M.new(names, sizes), out
end

Shape.__tostring = function(s)
  local parts = {}
  for i, n in ipairs(s.names) do parts[i] = n .. "=" .. s.sizes[i] end
  return "{" .. table.concat(parts, ", ") .. "}"
end

Shape.__eq = function(a, b)
  if #a.names ~= #b.names then return false end
  for i = 1, #a.names do
    if a.names[i] ~= b.names[i] or a.sizes[i] ~= b.sizes[i] then return false end
  end
  return true
end

M.Shape = Shape
return M
