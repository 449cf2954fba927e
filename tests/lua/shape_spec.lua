-- Shape: ordered named dimensions; 0-based coordinates, 1-based flat indices.
local shape = require "monarch.shape"

-- The message of the error fn(...) raises (fails the test if it raises none).
local function error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

local function abc() return shape.new({ "a", "b", "c" }, { 2, 3, 4 }) end

describe("shape.new", function()
  it("keeps the names and sizes in order", function()
    local s = abc()
    assert.same({ "a", "b", "c" }, s.names)
    assert.same({ 2, 3, 4 }, s.sizes)
  end)

  it("rejects a name that appears twice, naming it", function()
    local msg = error_of(shape.new, { "a", "b", "a" }, { 1, 2, 3 })
    assert.matches("dimension 'a' appears twice", msg, 1, true)
  end)

  it("rejects a zero size, naming the dimension", function()
    local msg = error_of(shape.new, { "a", "b" }, { 2, 0 })
    assert.matches("dimension 'b' needs a positive integer size, got 0", msg, 1, true)
  end)

  it("rejects a negative size, naming the dimension", function()
    local msg = error_of(shape.new, { "procs" }, { -3 })
    assert.matches("dimension 'procs' needs a positive integer size, got -3", msg, 1, true)
  end)

  it("rejects a fractional size", function()
    local msg = error_of(shape.new, { "x" }, { 1.5 })
    assert.matches("dimension 'x' needs a positive integer size, got 1.5", msg, 1, true)
  end)

  it("rejects a size that is not a number", function()
    local msg = error_of(shape.new, { "x" }, { "2" })
    assert.matches("dimension 'x' needs a positive integer size", msg, 1, true)
  end)

  it("rejects a name that is not a string", function()
    local msg = error_of(shape.new, { "a", 7 }, { 1, 2 })
    assert.matches("dimension 2 has a non-string name", msg, 1, true)
  end)

  it("rejects names and sizes of different lengths", function()
    local msg = error_of(shape.new, { "a", "b" }, { 1 })
    assert.matches("names and sizes differ in length", msg, 1, true)
  end)

  it("blames the caller's line for a bad size", function()
    local msg = error_of(function() local s = shape.new({ "a" }, { 0 }); return s end)
    assert.matches("shape_spec.lua:%d+:", msg)
  end)
end)

describe("shape:size", function()
  it("is the product of the sizes", function()
    assert.equal(24, abc():size())
    assert.equal(5, shape.new({ "procs" }, { 5 }):size())
  end)

  it("is 1 for a shape with no dimensions", function()
    assert.equal(1, shape.new({}, {}):size())
  end)
end)

describe("shape:dim", function()
  it("returns the size and position of a named dimension", function()
    local size, pos = abc():dim("b")
    assert.equal(3, size)
    assert.equal(2, pos)
  end)

  it("returns nil for an unknown dimension", function()
    assert.is_nil(abc():dim("z"))
  end)
end)

describe("shape:index", function()
  it("is row-major: the last dimension varies fastest", function()
    local s = abc()
    assert.equal(1, s:index { a = 0, b = 0, c = 0 })
    assert.equal(2, s:index { a = 0, b = 0, c = 1 })
    assert.equal(5, s:index { a = 0, b = 1, c = 0 })
    assert.equal(13, s:index { a = 1, b = 0, c = 0 })
    assert.equal(24, s:index { a = 1, b = 2, c = 3 })
  end)

  it("accepts positional coordinates", function()
    assert.equal(24, abc():index { 1, 2, 3 })
    assert.equal(abc():index { a = 1, b = 1, c = 2 }, abc():index { 1, 1, 2 })
  end)

  it("round-trips with coords for every element of {a=2, b=3, c=4}", function()
    local s = abc()
    local seen = {}
    for i = 1, s:size() do
      local c = s:coords(i)
      assert.equal(i, s:index(c))
      local key = c.a .. "," .. c.b .. "," .. c.c
      assert.is_nil(seen[key], "coords repeat: " .. key)
      seen[key] = true
    end
    local n = 0
    for a = 0, 1 do
      for b = 0, 2 do
        for c = 0, 3 do
          n = n + 1
          assert.same({ a = a, b = b, c = c }, s:coords(n))
          assert.equal(n, s:index { a = a, b = b, c = c })
        end
      end
    end
    assert.equal(24, n)
  end)

  it("lets a dimension of size 1 be left out", function()
    local s = shape.new({ "hosts", "procs" }, { 1, 4 })
    assert.equal(3, s:index { procs = 2 })
  end)

  it("errors when a dimension of size > 1 is left out", function()
    local msg = error_of(function() return abc():index { a = 0, c = 0 } end)
    assert.matches("coordinate for dimension 'b' is missing", msg, 1, true)
  end)

  it("errors for a coordinate past the end, giving the range", function()
    local msg = error_of(function() return abc():index { a = 0, b = 3, c = 0 } end)
    assert.matches("coordinate b = 3 is outside 0..2", msg, 1, true)
  end)

  it("errors for a negative coordinate", function()
    local msg = error_of(function() return abc():index { a = -1, b = 0, c = 0 } end)
    assert.matches("coordinate a = -1 is outside 0..1", msg, 1, true)
  end)

  it("errors for a fractional coordinate", function()
    local msg = error_of(function() return abc():index { a = 0, b = 0.5, c = 0 } end)
    assert.matches("coordinate b = 0.5 is outside", msg, 1, true)
  end)

  it("errors for an unknown dimension, naming it and the shape", function()
    local msg = error_of(function() return abc():index { a = 0, b = 0, c = 0, z = 0 } end)
    assert.matches("no dimension named 'z' in {a=2, b=3, c=4}", msg, 1, true)
  end)
end)

describe("shape:coords", function()
  it("gives 0-based coordinates of a flat 1-based index", function()
    local s = abc()
    assert.same({ a = 0, b = 0, c = 0 }, s:coords(1))
    assert.same({ a = 0, b = 0, c = 3 }, s:coords(4))
    assert.same({ a = 0, b = 1, c = 0 }, s:coords(5))
    assert.same({ a = 1, b = 2, c = 3 }, s:coords(24))
  end)
end)

describe("shape:slice", function()
  it("drops a dimension given an integer", function()
    local s, keep = abc():slice { b = 1 }
    assert.same({ "a", "c" }, s.names)
    assert.same({ 2, 4 }, s.sizes)
    assert.same({ 5, 6, 7, 8, 17, 18, 19, 20 }, keep)
  end)

  it("keeps from..to-1 given {from, to}", function()
    local s, keep = abc():slice { c = { 1, 3 } }
    assert.same({ "a", "b", "c" }, s.names)
    assert.same({ 2, 3, 2 }, s.sizes)
    assert.same({ 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23 }, keep)
  end)

  it("defaults a missing from to 0 and a missing to to the size", function()
    local s1, k1 = abc():slice { b = { nil, 2 } }
    assert.same({ 2, 2, 4 }, s1.sizes)
    assert.same({ 1, 2, 3, 4, 5, 6, 7, 8, 13, 14, 15, 16, 17, 18, 19, 20 }, k1)
    local s2, k2 = abc():slice { b = { 2 } }
    assert.same({ 2, 1, 4 }, s2.sizes)
    assert.same({ 9, 10, 11, 12, 21, 22, 23, 24 }, k2)
  end)

  it("slices several dimensions at once", function()
    local s, keep = abc():slice { a = 1, b = { 0, 2 }, c = 3 }
    assert.same({ "b" }, s.names)
    assert.same({ 2 }, s.sizes)
    assert.same({ 16, 20 }, keep)
  end)

  it("returns the kept flat indices in row-major order", function()
    local _, keep = abc():slice { a = { 0, 2 }, b = { 1, 3 }, c = { 2, 4 } }
    assert.same({ 7, 8, 11, 12, 19, 20, 23, 24 }, keep)
  end)

  it("maps each kept index to the same coordinates in both shapes", function()
    local big = abc()
    local small, keep = big:slice { a = 1, c = { 1, 3 } }
    for i, flat in ipairs(keep) do
      local sc, bc = small:coords(i), big:coords(flat)
      assert.equal(1, bc.a)
      assert.equal(bc.b, sc.b)
      assert.equal(bc.c, sc.c + 1)
    end
  end)

  it("keeps everything given an empty spec", function()
    local s, keep = abc():slice {}
    assert.equal(abc(), s)
    assert.equal(24, #keep)
    for i = 1, 24 do assert.equal(i, keep[i]) end
  end)

  it("leaves a shape with no dimensions when every one is dropped", function()
    local s, keep = abc():slice { a = 1, b = 2, c = 3 }
    assert.same({}, s.names)
    assert.equal(1, s:size())
    assert.same({ 24 }, keep)
  end)

  it("errors for an integer outside the dimension", function()
    local msg = error_of(function() return abc():slice { b = 3 } end)
    assert.matches("slice: b = 3 is outside 0..2", msg, 1, true)
  end)

  it("errors for an empty range", function()
    local msg = error_of(function() return abc():slice { c = { 2, 2 } } end)
    assert.matches("slice: c = {2, 2} is not a non-empty range within 0..4", msg, 1, true)
  end)

  it("errors for a range past the end", function()
    local msg = error_of(function() return abc():slice { c = { 0, 5 } } end)
    assert.matches("is not a non-empty range", msg, 1, true)
  end)

  it("errors for a range starting below 0", function()
    local msg = error_of(function() return abc():slice { a = { -1, 1 } } end)
    assert.matches("is not a non-empty range", msg, 1, true)
  end)

  it("errors for a spec that is neither an integer nor a range", function()
    local msg = error_of(function() return abc():slice { a = "x" } end)
    assert.matches("slice: a wants an integer or {from, to}, got string", msg, 1, true)
  end)

  it("errors for an unknown dimension, naming it", function()
    local msg = error_of(function() return abc():slice { z = 0 } end)
    assert.matches("slice: no dimension named 'z' in {a=2, b=3, c=4}", msg, 1, true)
  end)

  it("does not change the shape it slices", function()
    local s = abc()
    s:slice { a = 0, b = { 1, 2 } }
    assert.equal(abc(), s)
  end)
end)

describe("tostring(shape)", function()
  it("lists name=size in order", function()
    assert.equal("{a=2, b=3, c=4}", tostring(abc()))
    assert.equal("{}", tostring(shape.new({}, {})))
  end)
end)

describe("shape equality", function()
  it("holds for equal names and sizes", function()
    assert.is_true(abc() == abc())
  end)

  it("fails for a different size", function()
    assert.is_false(abc() == shape.new({ "a", "b", "c" }, { 2, 3, 5 }))
  end)

  it("fails for a different name", function()
    assert.is_false(abc() == shape.new({ "a", "b", "d" }, { 2, 3, 4 }))
  end)

  it("fails for the same dimensions in another order", function()
    assert.is_false(abc() == shape.new({ "b", "a", "c" }, { 3, 2, 4 }))
  end)

  it("fails for a different number of dimensions", function()
    assert.is_false(abc() == shape.new({ "a", "b" }, { 2, 3 }))
  end)
end)
