-- HostTensor: a fetched copy of a tensor, held in FFI memory on the controller.
local ffi = require "ffi"
local monarch = require "monarch"
local tensor = monarch.tensor

local function error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

local function pack(ctype, values)
  local buf = ffi.new(ctype .. "[?]", #values, values)
  return ffi.string(buf, ffi.sizeof(buf))
end

describe("tensor.host", function()
  it("round-trips f32 bytes through :bytes() and :totable()", function()
    local bytes = pack("float", { 1.5, -2.25, 1024 })
    local h = tensor.host("f32", { 3 }, bytes)
    assert.is_true(tensor.is_host(h))
    assert.equal("f32", h.dtype)
    assert.same({ 3 }, h.shape)
    assert.equal(3, h.numel)
    assert.equal(bytes, h:bytes())
    assert.equal(12, #h:bytes())
    assert.same({ 1.5, -2.25, 1024 }, h:totable())
  end)

  it("round-trips f64 values exactly", function()
    local vals = { 0.1, -1e300, 3.141592653589793, 2 ^ 53 }
    local bytes = pack("double", vals)
    local h = tensor.host("f64", { 2, 2 }, bytes)
    assert.equal(4, h.numel)
    assert.same(vals, h:totable())
    assert.equal(bytes, h:bytes())
  end)

  it("round-trips negative i32 values", function()
    local vals = { -2147483648, -1, 0, 2147483647 }
    local h = tensor.host("i32", { 4 }, pack("int32_t", vals))
    assert.same(vals, h:totable())
    assert.equal(-1, h[2])
  end)

  it("reads u8 bytes as 0..255", function()
    local h = tensor.host("u8", { 4 }, "\0\1\127\255")
    assert.same({ 0, 1, 127, 255 }, h:totable())
    assert.equal("\0\1\127\255", h:bytes())
  end)

  it("is zeroed when built without bytes", function()
    local h = tensor.host("f32", { 2, 3 })
    assert.equal(6, h.numel)
    assert.same({ 0, 0, 0, 0, 0, 0 }, h:totable())
    assert.equal(string.rep("\0", 24), h:bytes())
  end)

  it("copies the bytes rather than pointing into the string", function()
    local bytes = pack("float", { 1, 2 })
    local h = tensor.host("f32", { 2 }, bytes)
    h[1] = 9
    assert.equal(pack("float", { 1, 2 }), bytes)
    assert.same({ 9, 2 }, h:totable())
  end)

  it("errors for a byte string of the wrong length, giving both lengths", function()
    assert.matches("host tensor of 12 bytes built from 11 bytes",
      error_of(tensor.host, "f32", { 3 }, string.rep("\0", 11)), 1, true)
    assert.matches("host tensor of 12 bytes built from 16 bytes",
      error_of(tensor.host, "f32", { 3 }, string.rep("\0", 16)), 1, true)
  end)

  it("errors for an unknown dtype, naming it", function()
    assert.matches("unknown dtype 'f128'", error_of(tensor.host, "f128", { 1 }), 1, true)
  end)

  it("holds no elements for a shape with a zero size", function()
    local h = tensor.host("f32", { 0 }, "")
    assert.equal(0, h.numel)
    assert.same({}, h:totable())
    assert.equal("", h:bytes())
  end)
end)

describe("host tensor indexing", function()
  local function h3() return tensor.host("f32", { 3 }, pack("float", { 10, 20, 30 })) end

  it("is 1-based", function()
    local h = h3()
    assert.equal(10, h[1])
    assert.equal(20, h[2])
    assert.equal(30, h[3])
  end)

  it("returns plain Lua numbers", function()
    assert.equal("number", type(h3()[1]))
  end)

  it("errors below 1 and past the end, giving the range", function()
    local h = h3()
    assert.matches("index 0 is outside 1..3", error_of(function() return h[0] end), 1, true)
    assert.matches("index 4 is outside 1..3", error_of(function() return h[4] end), 1, true)
  end)

  it("writes 1-based, visible in totable and bytes", function()
    local h = h3()
    h[3] = 0.5
    assert.same({ 10, 20, 0.5 }, h:totable())
    assert.equal(pack("float", { 10, 20, 0.5 }), h:bytes())
  end)

  it("errors on a write out of range", function()
    local h = h3()
    assert.matches("host tensor index 4 is outside 1..3", error_of(function() h[4] = 1 end), 1, true)
    assert.matches("host tensor index 0 is outside 1..3", error_of(function() h[0] = 1 end), 1, true)
  end)

  it("stores f32 with f32 precision", function()
    local h = tensor.host("f32", { 1 })
    h[1] = 0.1
    assert.are_not.equal(0.1, h[1])
    assert.is_true(math.abs(h[1] - 0.1) < 1e-7)
  end)

  it("wraps u8 writes like C", function()
    local h = tensor.host("u8", { 1 })
    h[1] = 256 + 7
    assert.equal(7, h[1])
  end)
end)

describe("tostring(host tensor)", function()
  it("shows dtype, shape and the values", function()
    local h = tensor.host("f32", { 3 }, pack("float", { 1, 2.5, -3 }))
    assert.equal("HostTensor(f32, {3}) [1, 2.5, -3]", tostring(h))
  end)

  it("shows the first 8 values and then ...", function()
    local vals = {}
    for i = 1, 10 do vals[i] = i end
    local h = tensor.host("i32", { 2, 5 }, pack("int32_t", vals))
    assert.equal("HostTensor(i32, {2,5}) [1, 2, 3, 4, 5, 6, 7, 8, ...]", tostring(h))
  end)
end)

describe("tensor.is_host", function()
  it("is false for other tables", function()
    assert.is_false(tensor.is_host({}))
    assert.is_false(tensor.is(tensor.host("u8", { 1 })))
  end)
end)
