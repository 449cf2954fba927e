--- Curves of a run as an SVG line plot and as CSV; plain text, no dependency.
--   local plot = require "monarch.plot"
--   local svg = plot.svg {
--     title = "digits, 4 procs",
--     x = { label = "step", values = steps },
--     y = { label = "loss", min = 0 },                        -- the left axis
--     y2 = { label = "accuracy (%)", min = 0, max = 100 },    -- an optional right axis
--     series = {
--       { name = "loss", values = loss },
--       { name = "accuracy", values = acc, axis = "y2" },
--     },
--   }
--   local csv = plot.csv({ "step", "loss" }, { steps, loss })
--   assert(plot.write("curves.svg", svg))
--
-- Misuse (an empty series, a NaN in a plot, lengths that differ) raises an
-- error that names the series and the value; a file that cannot be written
-- is a runtime failure: write returns nil and a message naming the path.
local M = {}

M.WIDTH, M.HEIGHT = 720, 400 -- default picture size, px
local MIN_SIZE = 200         -- smallest width or height that leaves room for the axes, px
local TICKS = 5              -- about this many intervals between ticks on an axis
local CHAR_WIDTH = 7         -- rough width of a 12 px sans-serif character, px (legend layout)

-- Distinct from the greys of the frame, the grid and the text, so that a
-- curve can be told from them in a rendered picture.
M.PALETTE = { "#1f6fb4", "#e8710a", "#2a9d3a", "#c62828", "#7b4fb0", "#8c564b" }

local MARGIN = { left = 64, right = 24, right_y2 = 64, top = 48, bottom = 52 } -- px around the plot area

local floor, ceil, abs, log10 = math.floor, math.ceil, math.abs, math.log10
local fmt = string.format

-- Misuse: the message alone (the depth of the caller varies with the check).
local function fail(msg) error("plot: " .. msg, 0) end

-- ---- input checks -----------------------------------------------------------------------

-- What v is, for a message: "NaN", "infinite", "a string".
local function not_finite(v)
  if type(v) ~= "number" then return "a " .. type(v) .. ", not a number" end
  if v ~= v then return "NaN" end
  if v == math.huge or v == -math.huge then return "infinite" end
end

-- Checks that values is a non-empty list of finite numbers; returns its length.
local function check_values(values, what)
  if type(values) ~= "table" then fail(fmt("%s needs a list of values, got a %s", what, type(values))) end
  local n = #values
  if n == 0 then fail(what .. " is empty: nothing to plot") end
  for i = 1, n do
    local bad = not_finite(values[i])
    if bad then fail(fmt("%s value %d is %s", what, i, bad)) end
  end
  return n
end

local function check_bound(axis, key, name)
  local v = axis[key]
  if v ~= nil and not_finite(v) then fail(fmt("%s.%s is %s", name, key, not_finite(v))) end
end

-- ---- scales -------------------------------------------------------------------------------

-- A tick interval of 1, 2, 2.5 or 5 times a power of ten, near range / TICKS.
local function nice_step(range)
  local raw = range / TICKS
  local mag = 10 ^ floor(log10(raw))
  local f = raw / mag
  local nice = f <= 1 and 1 or f <= 2 and 2 or f <= 2.5 and 2.5 or f <= 5 and 5 or 10
  return nice * mag
end

-- Decimals that print every multiple of step exactly (2.5 -> 1, 0.05 -> 2).
local function decimals(step)
  for d = 0, 10 do
    local x = step * 10 ^ d
    if abs(x - floor(x + 0.5)) < 1e-6 * x then return d end
  end
  return 10
end

--[[ The scale of an axis over data lo..hi. The axis includes opts.min and
  opts.max when given. tight: ends at the data (x); otherwise rounded out to
  whole ticks (y). Returns { lo, hi, ticks = {...}, decimals }. ]]
local function scale(lo, hi, opts, tight)
  if opts.min and opts.min < lo then lo = opts.min end
  if opts.max and opts.max > hi then hi = opts.max end
  if hi == lo then -- one value: an interval around it
    local pad = abs(lo) * 0.1
    if pad == 0 then pad = 1 end
    lo, hi = lo - pad, hi + pad
  end
  local step = nice_step(hi - lo)
  if not tight then lo, hi = floor(lo / step + 1e-9) * step, ceil(hi / step - 1e-9) * step end
  local ticks = {}
  for i = ceil(lo / step - 1e-9), floor(hi / step + 1e-9) do
    local v = i * step
    ticks[#ticks + 1] = v == 0 and 0 or v -- not -0, which prints as "-0.0"
  end
  return { lo = lo, hi = hi, ticks = ticks, decimals = decimals(step) }
end

local function range_of(series)
  local lo, hi = math.huge, -math.huge
  for _, s in ipairs(series) do
    for _, v in ipairs(s.values) do
      if v < lo then lo = v end
      if v > hi then hi = v end
    end
  end
  return lo, hi
end

-- ---- SVG ------------------------------------------------------------------------------------

local function esc(s)
  return (tostring(s):gsub("[&<>\"]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;" }))
end

local function text(out, x, y, s, attrs)
  out[#out + 1] = fmt('<text x="%.1f" y="%.1f"%s>%s</text>', x, y, attrs or "", esc(s))
end

-- Validates spec; returns the x values, the series split by axis, and the size.
local function check_spec(spec)
  if type(spec) ~= "table" then fail("svg needs a table, got a " .. type(spec)) end
  if type(spec.x) ~= "table" then fail("spec.x needs a table { label =, values = }") end
  local n = check_values(spec.x.values, "x")
  if type(spec.series) ~= "table" or #spec.series == 0 then fail("no series to plot") end
  local by_axis = { y = {}, y2 = {} }
  for i, s in ipairs(spec.series) do
    if type(s) ~= "table" then fail(fmt("series %d needs a table, got a %s", i, type(s))) end
    local name = s.name or ("series " .. i)
    local axis = s.axis or "y"
    if not by_axis[axis] then fail(fmt("series '%s' has axis '%s'; it wants y or y2", name, tostring(axis))) end
    local m = check_values(s.values, "series '" .. name .. "'")
    if m ~= n then fail(fmt("series '%s' has %d values but x has %d", name, m, n)) end
    by_axis[axis][#by_axis[axis] + 1] = s
  end
  for _, a in ipairs { "y", "y2" } do
    local ax = spec[a] or {}
    if type(ax) ~= "table" then fail(fmt("spec.%s needs a table, got a %s", a, type(ax))) end
    check_bound(ax, "min", a)
    check_bound(ax, "max", a)
  end
  local w, h = spec.width or M.WIDTH, spec.height or M.HEIGHT
  for _, kv in ipairs { { "width", w }, { "height", h } } do
    if type(kv[2]) ~= "number" or kv[2] < MIN_SIZE then
      fail(fmt("%s must be a number of at least %d px", kv[1], MIN_SIZE))
    end
  end
  if #by_axis.y == 0 then fail("every series is on y2; put at least one on the left axis (y)") end
  return spec.x.values, by_axis, w, h
end

-- The pixel of value v on scale sc drawn from pixel a (its lo) to pixel b (its hi).
local function px(sc, a, b, v) return a + (v - sc.lo) / (sc.hi - sc.lo) * (b - a) end

local function line(out, x1, y1, x2, y2, attrs)
  out[#out + 1] = fmt('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"%s/>', x1, y1, x2, y2, attrs or "")
end

-- The frame, the grid and the tick labels of the x axis and the left axis (y).
local function draw_axes(out, box, xs, ys, labels)
  local function gx(v) return px(xs, box.x0, box.x1, v) end
  local function gy(v) return px(ys, box.y1, box.y0, v) end
  out[#out + 1] = '<g class="grid" stroke="#e4e4e4" stroke-width="1">'
  for _, t in ipairs(xs.ticks) do line(out, gx(t), box.y0, gx(t), box.y1) end
  for _, t in ipairs(ys.ticks) do line(out, box.x0, gy(t), box.x1, gy(t)) end
  out[#out + 1] = "</g>"
  out[#out + 1] = fmt('<rect class="frame" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#444"/>',
    box.x0, box.y0, box.x1 - box.x0, box.y1 - box.y0)
  out[#out + 1] = '<g class="ticks" fill="#333">'
  for _, t in ipairs(xs.ticks) do
    text(out, gx(t), box.y1 + 17, fmt("%." .. xs.decimals .. "f", t), ' text-anchor="middle"')
  end
  for _, t in ipairs(ys.ticks) do
    text(out, box.x0 - 6, gy(t) + 4, fmt("%." .. ys.decimals .. "f", t), ' text-anchor="end"')
  end
  out[#out + 1] = "</g>"
  if labels.x then text(out, (box.x0 + box.x1) / 2, box.y1 + 38, labels.x, ' class="xlabel" text-anchor="middle"') end
  if labels.y then
    local cy = (box.y0 + box.y1) / 2
    text(out, 18, cy, labels.y, fmt(' class="ylabel" text-anchor="middle" transform="rotate(-90 18 %.1f)"', cy))
  end
end

-- The tick labels of the right axis (y2), and its label.
local function draw_y2(out, box, ys, label, width)
  local function gy(v) return px(ys, box.y1, box.y0, v) end
  out[#out + 1] = '<g class="ticks2" fill="#333">'
  for _, t in ipairs(ys.ticks) do
    line(out, box.x1, gy(t), box.x1 + 4, gy(t), ' stroke="#444"')
    text(out, box.x1 + 7, gy(t) + 4, fmt("%." .. ys.decimals .. "f", t), ' text-anchor="start"')
  end
  out[#out + 1] = "</g>"
  if label then
    local cx, cy = width - 14, (box.y0 + box.y1) / 2
    text(out, cx, cy, label, fmt(' class="y2label" text-anchor="middle" transform="rotate(90 %.1f %.1f)"', cx, cy))
  end
end

-- One <polyline> per series (a dot when it has one point).
local function draw_series(out, box, xs, ys, x, s, colour)
  local pts = {}
  for i, v in ipairs(s.values) do
    pts[i] = fmt("%.1f,%.1f", px(xs, box.x0, box.x1, x[i]), px(ys, box.y1, box.y0, v))
  end
  local width = s.width or 1.5
  out[#out + 1] = fmt('<polyline class="series" data-name="%s" fill="none" stroke="%s" stroke-width="%g" ' ..
    'stroke-linejoin="round" points="%s"/>', esc(s.name or ""), colour, width, table.concat(pts, " "))
  if #pts == 1 then
    local px, py = pts[1]:match("([^,]+),(.+)")
    out[#out + 1] = fmt('<circle cx="%s" cy="%s" r="%g" fill="%s"/>', px, py, width + 1.5, colour)
  end
end

-- The legend: one row under the title, right-aligned, a swatch and a name
-- per series, in the order of the series.
local function draw_legend(out, box, entries)
  local gap, total = 14, 0 -- px between entries
  for i, e in ipairs(entries) do
    e.w = 20 + CHAR_WIDTH * #e.name -- swatch, space, name
    total = total + e.w + (i > 1 and gap or 0)
  end
  local x = box.x1 - total
  out[#out + 1] = '<g class="legend">'
  for _, e in ipairs(entries) do
    line(out, x, box.y0 - 12, x + 16, box.y0 - 12, fmt(' stroke="%s" stroke-width="3"', e.colour))
    text(out, x + 20, box.y0 - 8, e.name)
    x = x + e.w + gap
  end
  out[#out + 1] = "</g>"
end

--[[ svg(spec) -> the text of an SVG line plot.
  spec.x       { label =, values = {numbers} }, shared by every series
  spec.series  { { name =, values = {numbers, as many as x}, axis = "y" | "y2",
                   colour = "#rrggbb" (from PALETTE), width = px (1.5) }, ... }
  spec.y, spec.y2  { label =, min =, max = }: the left and the right axis; the
               axis always includes min and max when given (y2 is drawn when a
               series is on it)
  spec.title, spec.width (WIDTH), spec.height (HEIGHT)
  Raises on an empty series, a value that is not a finite number, or series
  and x of different lengths, naming the series and the value. ]]
function M.svg(spec)
  local x, by_axis, w, h = check_spec(spec)
  local has_y2 = #by_axis.y2 > 0
  local box = { x0 = MARGIN.left, x1 = w - (has_y2 and MARGIN.right_y2 or MARGIN.right),
    y0 = MARGIN.top, y1 = h - MARGIN.bottom }
  local xlo, xhi = range_of { { values = x } }
  local xs = scale(xlo, xhi, {}, true)
  local yopt, y2opt = spec.y or {}, spec.y2 or {}
  local ylo, yhi = range_of(by_axis.y)
  local ys = scale(ylo, yhi, yopt, false)
  local out = {
    fmt('<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" ' ..
      'font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">', w, h, w, h),
    fmt('<rect width="%g" height="%g" fill="#ffffff"/>', w, h),
  }
  if spec.title then text(out, box.x0, 20, spec.title, ' class="title" font-size="14" font-weight="bold"') end
  draw_axes(out, box, xs, ys, { x = spec.x.label, y = yopt.label })
  local y2s
  if has_y2 then
    local lo, hi = range_of(by_axis.y2)
    y2s = scale(lo, hi, y2opt, false)
    draw_y2(out, box, y2s, y2opt.label, w)
  end
  local entries = {}
  for i, s in ipairs(spec.series) do
    local colour = s.colour or M.PALETTE[(i - 1) % #M.PALETTE + 1]
    draw_series(out, box, xs, (s.axis == "y2") and y2s or ys, x, s, colour)
    entries[#entries + 1] = { name = s.name or ("series " .. i), colour = colour }
  end
  draw_legend(out, box, entries)
  out[#out + 1] = "</svg>\n"
  return table.concat(out, "\n")
end

-- ---- CSV ------------------------------------------------------------------------------------

-- A number as CSV writes it: integers whole, others to 10 significant
-- digits; NaN and infinities as Python's float() reads them.
local function csv_number(v)
  if v ~= v then return "nan" end
  if v == math.huge then return "inf" end
  if v == -math.huge then return "-inf" end
  if v == floor(v) and abs(v) < 2 ^ 53 then return fmt("%d", v) end
  return fmt("%.10g", v)
end

--[[ csv(header, columns) -> CSV text: a header line of names, then one row
  per index of the columns. header: { "step", "loss", ... }; columns: as many
  lists of numbers, all of one length. A CSV records what happened, so NaN
  and infinities are written ("nan", "inf", "-inf"); a value that is not a
  number, or columns of different lengths, raise. ]]
function M.csv(header, columns)
  if type(header) ~= "table" or #header == 0 then fail("csv needs a header: a list of column names") end
  if type(columns) ~= "table" or #columns ~= #header then
    fail(fmt("csv has %d column names but %d columns", #header, type(columns) == "table" and #columns or 0))
  end
  for i, name in ipairs(header) do
    if type(name) ~= "string" or name:find('[,"\r\n]') or name == "" then
      fail(fmt("csv column name %d (%s) must be a non-empty string without commas, quotes or newlines", i,
        tostring(name)))
    end
    if type(columns[i]) ~= "table" then fail(fmt("csv column '%s' needs a list of numbers", name)) end
    if #columns[i] ~= #columns[1] then
      fail(fmt("csv column '%s' has %d values but '%s' has %d", name, #columns[i], header[1], #columns[1]))
    end
  end
  local lines = { table.concat(header, ",") }
  local row = {}
  for r = 1, #columns[1] do
    for c, col in ipairs(columns) do
      local v = col[r]
      if type(v) ~= "number" then fail(fmt("csv column '%s' value %d is a %s, not a number", header[c], r, type(v))) end
      row[c] = csv_number(v)
    end
    lines[#lines + 1] = table.concat(row, ",")
  end
  return table.concat(lines, "\n") .. "\n"
end

-- ---- files ------------------------------------------------------------------------------------

-- "cannot write PATH: reason", from io.open's "PATH: reason".
local function cannot(path, err)
  local reason = tostring(err)
  if reason:sub(1, #path + 2) == path .. ": " then reason = reason:sub(#path + 3) end
  return "cannot write " .. path .. ": " .. reason
end

--- write(path, text) -> true, or nil and "cannot write PATH: reason".
function M.write(path, text_)
  if type(path) ~= "string" or path == "" then fail("write needs a file name") end
  local f, err = io.open(path, "wb")
  if not f then return nil, cannot(path, err) end
  local ok, werr = f:write(text_)
  local closed, cerr = f:close()
  if not ok or not closed then return nil, cannot(path, werr or cerr) end
  return true
end

--- writable(path) -> true, or nil and "cannot write PATH: reason". Tries to
-- open the file for appending, so nothing in it changes; a file it had to
-- create for the test is removed again. Lets a program refuse a bad output
-- path before a long run rather than after it.
function M.writable(path)
  if type(path) ~= "string" or path == "" then fail("writable needs a file name") end
  local before = io.open(path, "rb")
  if before then before:close() end
  local f, err = io.open(path, "ab")
  if not f then return nil, cannot(path, err) end
  f:close()
  if not before then os.remove(path) end
  return true
end

return M
