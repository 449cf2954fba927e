-- monarch.plot: the SVG line plot's structure, the CSV's values, and the
-- errors for bad input and for files that cannot be written.
local plot = require "monarch.plot"

local function error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

local function range(n, f)
  local t = {}
  for i = 1, n do t[i] = f(i) end
  return t
end

-- A loss falling from 2.4 and an accuracy rising to 100 over 50 steps.
local function two_axes(extra)
  local spec = {
    title = "a <run> & more",
    x = { label = "step", values = range(50, function(i) return i end) },
    y = { label = "loss", min = 0 },
    y2 = { label = "accuracy (%)", min = 0, max = 100 },
    series = {
      { name = "loss", values = range(50, function(i) return 2.4 * (51 - i) / 50 end) },
      { name = "accuracy", values = range(50, function(i) return 2 * i end), axis = "y2" },
    },
  }
  for k, v in pairs(extra or {}) do spec[k] = v end
  return spec
end

-- {name, colour, points = {{x, y}, ...}} of every polyline.
local function polylines(svg)
  local t = {}
  for attrs in svg:gmatch("<polyline (.-)/>") do
    local pts = {}
    for x, y in attrs:match('points="([^"]*)"'):gmatch("([%d.%-]+),([%d.%-]+)") do
      pts[#pts + 1] = { tonumber(x), tonumber(y) }
    end
    t[#t + 1] = { name = attrs:match('data%-name="([^"]*)"'), colour = attrs:match('stroke="([^"]*)"'), points = pts }
  end
  return t
end

local function frame(svg)
  local x, y, w, h = svg:match('<rect class="frame" x="([%d.]+)" y="([%d.]+)" width="([%d.]+)" height="([%d.]+)"')
  x, y, w, h = tonumber(x), tonumber(y), tonumber(w), tonumber(h)
  return { x0 = x, y0 = y, x1 = x + w, y1 = y + h }
end

-- The texts of a <g class="...">: its tick labels.
local function labels(svg, class)
  local g = svg:match('<g class="' .. class .. '".->(.-)</g>') or ""
  local t = {}
  for s in g:gmatch("<text[^>]*>([^<]*)</text>") do t[#t + 1] = s end
  return t
end

describe("plot.svg", function()
  it("draws one polyline per series, each point inside the frame, from its left edge to its right", function()
    local svg = plot.svg(two_axes())
    assert.matches('^<svg xmlns="http://www.w3.org/2000/svg" width="720" height="400"', svg)
    assert.matches("</svg>\n$", svg)
    local lines, box = polylines(svg), frame(svg)
    assert.are.equal(2, #lines)
    assert.are.same({ "loss", "accuracy" }, { lines[1].name, lines[2].name })
    assert.are.same({ plot.PALETTE[1], plot.PALETTE[2] }, { lines[1].colour, lines[2].colour })
    for _, l in ipairs(lines) do
      assert.are.equal(50, #l.points)
      assert.are.equal(box.x0, l.points[1][1])
      assert.are.equal(box.x1, l.points[50][1])
      for i, p in ipairs(l.points) do
        assert.is_true(p[2] >= box.y0 and p[2] <= box.y1, "point " .. i .. " of " .. l.name .. " is outside the frame")
        if i > 1 then assert.is_true(p[1] > l.points[i - 1][1]) end
      end
    end
    -- The loss falls (screen y grows) to 0.048 near the bottom; the accuracy reaches the top (100 %).
    assert.is_true(lines[1].points[1][2] < lines[1].points[50][2])
    assert.is_true(lines[1].points[50][2] > box.y1 - 10)
    assert.are.equal(box.y0, lines[2].points[50][2])
  end)

  it("puts whole ticks on the axes: 0.0 to 2.5 for the loss, 0 to 100 for the accuracy", function()
    local svg = plot.svg(two_axes())
    local ticks = labels(svg, "ticks")
    assert.are.same({ "10", "20", "30", "40", "50", "0.0", "0.5", "1.0", "1.5", "2.0", "2.5" }, ticks)
    assert.are.same({ "0", "20", "40", "60", "80", "100" }, labels(svg, "ticks2"))
  end)

  it("writes the title, the axis labels and the legend, escaping markup", function()
    local svg = plot.svg(two_axes())
    assert.matches(">a &lt;run&gt; &amp; more</text>", svg, 1, true)
    assert.matches('class="xlabel"[^>]*>step</text>', svg)
    assert.matches('class="ylabel"[^>]*>loss</text>', svg)
    assert.matches('class="y2label"[^>]*>accuracy %(%%%)</text>', svg)
    assert.are.same({ "loss", "accuracy" }, labels(svg, "legend"))
  end)

  it("draws no right axis when every series is on the left one", function()
    local spec = two_axes()
    spec.series[2] = nil
    local svg = plot.svg(spec)
    assert.is_nil(svg:find('class="ticks2"', 1, true))
    assert.are.equal(1, #polylines(svg))
  end)

  it("plots a single point as a dot, and a constant series around its value", function()
    local one = plot.svg { x = { values = { 3 } }, series = { { name = "r", values = { 7 } } } }
    assert.matches("<circle ", one, 1, true)
    local flat = plot.svg { x = { values = { 1, 2, 3 } }, series = { { name = "r", values = { 5, 5, 5 } } } }
    local box, p = frame(flat), polylines(flat)[1].points
    assert.is_true(p[1][2] > box.y0 and p[1][2] < box.y1)
  end)

  it("takes a colour, a width and a size", function()
    local spec = two_axes { width = 400, height = 300 }
    spec.series[1].colour, spec.series[1].width = "#123456", 3
    local svg = plot.svg(spec)
    assert.matches('width="400" height="300"', svg, 1, true)
    assert.matches('stroke="#123456" stroke-width="3"', svg, 1, true)
  end)
end)

describe("plot.svg refuses bad input", function()
  local function with_loss(values)
    local spec = two_axes()
    spec.series[1].values = values
    return spec
  end

  it("an empty series, naming it", function()
    assert.matches("plot: series 'loss' is empty: nothing to plot", error_of(plot.svg, with_loss {}), 1, true)
  end)

  it("a NaN, naming the series and the value", function()
    local v = range(50, function() return 1 end)
    v[17] = 0 / 0
    assert.matches("plot: series 'loss' value 17 is NaN", error_of(plot.svg, with_loss(v)), 1, true)
  end)

  it("an infinity or a value that is not a number", function()
    local v = range(50, function() return 1 end)
    v[3] = math.huge
    assert.matches("series 'loss' value 3 is infinite", error_of(plot.svg, with_loss(v)), 1, true)
    v[3] = "0.5"
    assert.matches("series 'loss' value 3 is a string, not a number", error_of(plot.svg, with_loss(v)), 1, true)
  end)

  it("a series whose length is not x's", function()
    assert.matches("series 'loss' has 2 values but x has 50", error_of(plot.svg, with_loss { 1, 2 }), 1, true)
  end)

  it("no x values, no series, an unknown axis, a size too small, a NaN bound", function()
    local no_x = { x = { values = {} }, series = { { values = {} } } }
    assert.matches("plot: x is empty", error_of(plot.svg, no_x), 1, true)
    assert.matches("plot: no series to plot", error_of(plot.svg, { x = { values = { 1 } }, series = {} }), 1, true)
    local spec = two_axes()
    spec.series[2].axis = "right"
    assert.matches("series 'accuracy' has axis 'right'; it wants y or y2", error_of(plot.svg, spec), 1, true)
    assert.matches("width must be a number of at least 200 px", error_of(plot.svg, two_axes { width = 50 }), 1, true)
    assert.matches("y.min is NaN", error_of(plot.svg, two_axes { y = { min = 0 / 0 } }), 1, true)
    assert.matches("svg needs a table", error_of(plot.svg, nil), 1, true)
  end)
end)

describe("plot.csv", function()
  it("writes a header and one row per index, integers whole and fractions to 10 digits", function()
    local text = plot.csv({ "step", "loss" }, { { 1, 2, 3 }, { 2.5, 1 / 3, 1e-12 } })
    assert.are.equal("step,loss\n1,2.5\n2,0.3333333333\n3,1e-12\n", text)
  end)

  it("records NaN and infinities as Python's float() reads them", function()
    assert.are.equal("v\nnan\ninf\n-inf\n", plot.csv({ "v" }, { { 0 / 0, math.huge, -math.huge } }))
  end)

  it("writes only the header for empty columns", function()
    assert.are.equal("a,b\n", plot.csv({ "a", "b" }, { {}, {} }))
  end)

  it("refuses columns of different lengths, a value that is not a number, and a bad name", function()
    assert.matches("csv column 'b' has 1 values but 'a' has 2", error_of(plot.csv, { "a", "b" }, { { 1, 2 }, { 1 } }),
      1, true)
    assert.matches("csv column 'a' value 2 is a string", error_of(plot.csv, { "a" }, { { 1, "x" } }), 1, true)
    assert.matches("csv has 2 column names but 1 columns", error_of(plot.csv, { "a", "b" }, { { 1 } }), 1, true)
    assert.matches("csv column name 1 (a,b) must be", error_of(plot.csv, { "a,b" }, { { 1 } }), 1, true)
  end)
end)

describe("plot.write and plot.writable", function()
  local dir
  before_each(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p '" .. dir .. "'") == 0)
  end)
  after_each(function() os.execute("rm -rf '" .. dir .. "'") end)

  local function read(p)
    local f = assert(io.open(p, "rb"))
    local s = f:read("*a")
    f:close()
    return s
  end

  it("writes the text to the file", function()
    assert.is_true(plot.write(dir .. "/a.csv", "x\n1\n"))
    assert.are.equal("x\n1\n", read(dir .. "/a.csv"))
  end)

  it("returns an error naming the path when the file cannot be written", function()
    local bad = dir .. "/no/such/dir/plot.svg"
    local ok, err = plot.write(bad, "<svg/>")
    assert.is_nil(ok)
    assert.are.equal("cannot write " .. bad .. ": No such file or directory", err)
    ok, err = plot.write(dir, "<svg/>")
    assert.is_nil(ok)
    assert.are.equal("cannot write " .. dir .. ": Is a directory", err)
  end)

  it("tells whether a path can be written without changing or leaving a file", function()
    local new, old = dir .. "/new.svg", dir .. "/old.svg"
    assert.is_true(plot.writable(new))
    assert.is_nil(io.open(new, "rb"))
    assert.is_true(plot.write(old, "kept"))
    assert.is_true(plot.writable(old))
    assert.are.equal("kept", read(old))
    local ok, err = plot.writable(dir .. "/missing/x.svg")
    assert.is_nil(ok)
    assert.are.equal("cannot write " .. dir .. "/missing/x.svg: No such file or directory", err)
  end)
end)
