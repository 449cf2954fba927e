-- ValueMesh: one value per proc, addressed by coordinates or flat index.
local shape = require "monarch.shape"
local value_mesh = require "monarch.value_mesh"

local function error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

-- {hosts=2, procs=3} holding "h<hosts>p<procs>" at each point.
local function mesh23()
  local s = shape.new({ "hosts", "procs" }, { 2, 3 })
  local vals = {}
  for i = 1, s:size() do
    local c = s:coords(i)
    vals[i] = "h" .. c.hosts .. "p" .. c.procs
  end
  return value_mesh.new(s, vals)
end

describe("value_mesh:get", function()
  it("finds a value by table coordinates", function()
    local vm = mesh23()
    assert.equal("h0p0", vm:get { hosts = 0, procs = 0 })
    assert.equal("h0p2", vm:get { hosts = 0, procs = 2 })
    assert.equal("h1p1", vm:get { hosts = 1, procs = 1 })
  end)

  it("finds a value by positional coordinates", function()
    local vm = mesh23()
    assert.equal("h1p0", vm:get(1, 0))
    assert.equal("h0p2", vm:get(0, 2))
    assert.equal("h1p2", vm:get(1, 2))
  end)

  it("errors for coordinates outside the shape", function()
    local msg = error_of(function() return mesh23():get(0, 3) end)
    assert.matches("coordinate procs = 3 is outside 0..2", msg, 1, true)
  end)

  it("errors for an unknown dimension", function()
    local msg = error_of(function() return mesh23():get { hosts = 0, procs = 0, gpus = 0 } end)
    assert.matches("no dimension named 'gpus'", msg, 1, true)
  end)
end)

describe("value_mesh indexing", function()
  it("vm[i] is the i-th value in rank order, 1-based", function()
    local vm = mesh23()
    assert.equal("h0p0", vm[1])
    assert.equal("h0p1", vm[2])
    assert.equal("h1p0", vm[4])
    assert.equal("h1p2", vm[6])
  end)

  it("vm[i] is nil outside 1..size", function()
    local vm = mesh23()
    assert.is_nil(vm[0])
    assert.is_nil(vm[7])
  end)

  it("still finds its methods and shape", function()
    local vm = mesh23()
    assert.is_function(vm.get)
    assert.equal(shape.new({ "hosts", "procs" }, { 2, 3 }), vm.shape)
  end)
end)

describe("value_mesh:size", function()
  it("is the shape's size by default", function()
    assert.equal(6, mesh23():size())
  end)

  it("is the n given, even when trailing values are nil", function()
    local vm = value_mesh.new(shape.new({ "procs" }, { 4 }), { 1, 2 }, 4)
    assert.equal(4, vm:size())
  end)
end)

describe("value_mesh:items", function()
  it("yields coordinates and values in rank order", function()
    local got = {}
    for c, v in mesh23():items() do got[#got + 1] = { c, v } end
    assert.same({
      { { hosts = 0, procs = 0 }, "h0p0" },
      { { hosts = 0, procs = 1 }, "h0p1" },
      { { hosts = 0, procs = 2 }, "h0p2" },
      { { hosts = 1, procs = 0 }, "h1p0" },
      { { hosts = 1, procs = 1 }, "h1p1" },
      { { hosts = 1, procs = 2 }, "h1p2" },
    }, got)
  end)

  it("does not stop at a nil value", function()
    local vm = value_mesh.new(shape.new({ "procs" }, { 3 }), { "a", nil, "c" })
    local n, vals = 0, {}
    for c, v in vm:items() do
      n = n + 1
      assert.equal(n - 1, c.procs)
      vals[n] = v
    end
    assert.equal(3, n)
    assert.equal("a", vals[1])
    assert.is_nil(vals[2])
    assert.equal("c", vals[3])
  end)
end)

describe("value_mesh:values", function()
  it("is a plain array of the values in rank order", function()
    local vals = mesh23():values()
    assert.same({ "h0p0", "h0p1", "h0p2", "h1p0", "h1p1", "h1p2" }, vals)
    assert.is_nil(getmetatable(vals))
  end)

  it("is a copy: changing it leaves the mesh alone", function()
    local vm = mesh23()
    local vals = vm:values()
    vals[1] = "changed"
    assert.equal("h0p0", vm[1])
  end)

  it("keeps nil values in their positions", function()
    local vm = value_mesh.new(shape.new({ "procs" }, { 4 }), { nil, 2, nil, 4 })
    local vals = vm:values()
    assert.is_nil(vals[1])
    assert.equal(2, vals[2])
    assert.is_nil(vals[3])
    assert.equal(4, vals[4])
    assert.is_nil(vm:get(0))
    assert.equal(2, vm:get(1))
    assert.is_nil(vm[3])
    assert.equal(4, vm[4])
  end)
end)

describe("value_mesh:map", function()
  it("applies fn to each value and its coordinates, keeping the shape", function()
    local vm = mesh23()
    local out = vm:map(function(v, c) return v .. "/" .. (c.hosts * 10 + c.procs) end)
    assert.is_true(value_mesh.is(out))
    assert.equal(vm.shape, out.shape)
    assert.same({ "h0p0/0", "h0p1/1", "h0p2/2", "h1p0/10", "h1p1/11", "h1p2/12" }, out:values())
  end)

  it("leaves the original mesh unchanged", function()
    local vm = mesh23()
    vm:map(function() return 0 end)
    assert.equal("h0p0", vm[1])
  end)

  it("keeps the size when fn returns nil", function()
    local vm = mesh23():map(function(_, c) if c.procs == 1 then return nil end return c.procs end)
    assert.equal(6, vm:size())
    assert.equal(0, vm[1])
    assert.is_nil(vm[2])
    assert.equal(2, vm[6])
  end)
end)

describe("value_mesh.is", function()
  it("tells a ValueMesh from other tables", function()
    assert.is_true(value_mesh.is(mesh23()))
    assert.is_false(value_mesh.is({}))
    assert.is_false(value_mesh.is(nil))
  end)
end)

describe("tostring(value_mesh)", function()
  it("shows the shape and every coordinate with its value", function()
    local vm = value_mesh.new(shape.new({ "hosts", "procs" }, { 1, 2 }), { 1.5, "x" })
    assert.equal('ValueMesh{hosts=1, procs=2}\n  [hosts=0,procs=0] 1.5\n  [hosts=0,procs=1] "x"', tostring(vm))
  end)

  it("shows nil values as nil", function()
    local vm = value_mesh.new(shape.new({ "procs" }, { 2 }), { nil, true })
    assert.equal("ValueMesh{procs=2}\n  [procs=0] nil\n  [procs=1] true", tostring(vm))
  end)

  it("shows plain tables' first 8 entries and cuts long strings", function()
    local vm = value_mesh.new(shape.new({ "procs" }, { 2 }),
      { { 1, 2, 3, 4, 5, 6, 7, 8, 9 }, string.rep("a", 50) })
    local s = tostring(vm)
    assert.matches("[procs=0] {1, 2, 3, 4, 5, 6, 7, 8, ...}", s, 1, true)
    assert.matches('[procs=1] "' .. string.rep("a", 37) .. '..."', s, 1, true)
  end)

  it("shows 16 values and then how many more there are", function()
    local vals = {}
    for i = 1, 20 do vals[i] = i * 100 end
    local s = tostring(value_mesh.new(shape.new({ "procs" }, { 20 }), vals))
    local lines = {}
    for line in s:gmatch("[^\n]+") do lines[#lines + 1] = line end
    assert.equal(18, #lines)
    assert.equal("ValueMesh{procs=20}", lines[1])
    assert.equal("  [procs=0] 100", lines[2])
    assert.equal("  [procs=15] 1600", lines[17])
    assert.equal("  ... (4 more)", lines[18])
    assert.is_nil(s:find("1700", 1, true))
  end)

  it("does not truncate exactly 16 values", function()
    local vals = {}
    for i = 1, 16 do vals[i] = i end
    local s = tostring(value_mesh.new(shape.new({ "procs" }, { 16 }), vals))
    assert.is_nil(s:find("more", 1, true))
    assert.matches("[procs=15] 16", s, 1, true)
  end)
end)
