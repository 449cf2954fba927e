--- monarch.jupyter_display: how values look in a notebook, for the Jupyter
-- kernel (monarch.jupyter). A value becomes a MIME bundle: text/plain as the
-- REPL prints it, and where that reads better text/html (a ValueMesh or a
-- ProcMesh as a table) or image/svg+xml (a monarch.plot figure). Also the
-- notebook's top() (an HTML table updated in place until interrupted) and
-- inspection (Shift-Tab): the LDoc comment above a Lua function.
local errors = require "monarch.errors"
local repl = require "monarch.repl"
local value_mesh = require "monarch.value_mesh"

local M = {}
M.MAX_ROWS = 64          -- rows of a ValueMesh or ProcMesh table; the rest are counted
M.TOP_ROWS, M.TOP_COLS = 500, 200 -- the "terminal" a notebook's top() lays its lines out for
M.TOP_POLL = 0.1         -- seconds between looks at top's answers
M.MAX_DOC_LINES = 40     -- comment lines shown by an inspection
M.TRAIN_EVERY = 5        -- steps between redraws of train_live's curve

local fmt = string.format

--- Escapes text for HTML.
local ENTITIES = { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;", ['"'] = "&quot;" }
function M.escape(s)
  s = tostring(s)
  if not s:find('[&<>"]') then return s end -- most cells of a table: gsub with a table is slow in LuaJIT
  return (s:gsub('[&<>"]', ENTITIES))
end
local esc = M.escape

--- True if s is an SVG picture (what monarch.plot.svg returns).
function M.is_svg(s)
  return type(s) == "string" and (s:match("^%s*<svg[%s>]") ~= nil or s:match("^%s*<%?xml[^>]*>%s*<svg[%s>]") ~= nil)
end

local function table_html(heads, rows, more)
  local out = { "<table><thead><tr>" }
  for _, h in ipairs(heads) do out[#out + 1] = "<th>" .. esc(h) .. "</th>" end
  out[#out + 1] = "</tr></thead><tbody>"
  for _, r in ipairs(rows) do
    out[#out + 1] = "<tr>"
    for _, c in ipairs(r) do out[#out + 1] = "<td>" .. esc(c) .. "</td>" end
    out[#out + 1] = "</tr>"
  end
  out[#out + 1] = "</tbody></table>"
  if more > 0 then out[#out + 1] = fmt("<p>... %d more</p>", more) end
  return table.concat(out)
end

-- A ValueMesh as a table: one column per dimension, then the value. The rows
-- go in flat order, so the coordinates count up like an odometer (last
-- dimension fastest), without a Shape:coords table per row: a cell's result
-- is rendered on every call a notebook makes.
local function value_mesh_html(vm)
  local names, sizes = vm.shape.names, vm.shape.sizes
  local size = vm:size()
  local out = { "<p><code>ValueMesh", esc(tostring(vm.shape)), "</code></p><table><thead><tr>" }
  for _, n in ipairs(names) do out[#out + 1] = "<th>" .. esc(n) .. "</th>" end
  out[#out + 1] = "<th>value</th></tr></thead><tbody>"
  local c = {}
  for d = 1, #names do c[d] = 0 end
  local rows = math.min(size, M.MAX_ROWS)
  for i = 1, rows do
    local coords = #names > 0 and "<td>" .. table.concat(c, "</td><td>") .. "</td>" or ""
    out[#out + 1] = "<tr>" .. coords .. "<td>" .. esc(repl.show(vm[i], 1, true)) .. "</td></tr>"
    local d = #names
    while d >= 1 do
      c[d] = c[d] + 1
      if c[d] < sizes[d] then break end
      c[d] = 0
      d = d - 1
    end
  end
  out[#out + 1] = "</tbody></table>"
  if size > rows then out[#out + 1] = fmt("<p>... %d more</p>", size - rows) end
  return table.concat(out)
end

-- A ProcMesh (anything with proc_list) as a table of its procs.
local function proc_mesh_html(m)
  local list = m:proc_list()
  local rows = {}
  for i = 1, math.min(#list, M.MAX_ROWS) do
    local p = list[i]
    rows[i] = { p.rank or "-", p.host or "-", p.pid or "-", p.state or "-" }
  end
  return fmt("<p><code>%s</code></p>", esc(tostring(m))) ..
    table_html({ "rank", "host", "pid", "state" }, rows, #list - #rows)
end

local function has_proc_list(v)
  local ok, f = pcall(function() return v.proc_list end)
  return ok and type(f) == "function" and getmetatable(v) ~= nil
end

--- The MIME bundle of value v.
function M.bundle(v)
  if M.is_svg(v) then return { ["image/svg+xml"] = v, ["text/plain"] = "<SVG picture>" } end
  local b = { ["text/plain"] = repl.show(v) }
  if value_mesh.is(v) then b["text/html"] = value_mesh_html(v)
  elseif type(v) == "table" and has_proc_list(v) then
    local ok, html = pcall(proc_mesh_html, v)
    if ok then b["text/html"] = html end
  end
  return b
end

--- The bundle of a cell's values (its result): one value's own bundle, or
-- several as the REPL prints them (tab-separated).
function M.result(r)
  if r.n == 2 then return M.bundle(r[2]) end
  local out = {}
  for i = 2, r.n do out[#out + 1] = repl.show(r[i]) end
  return { ["text/plain"] = table.concat(out, "\t") }
end

-- ---- errors --------------------------------------------------------------------

--- The parts of an error reply: ename, evalue and traceback lines (the
-- first line is the one that says what failed; the frames come after).
-- frames: a MonarchError's stack (debug.traceback's text), where it was raised.
function M.error_parts(e, frames)
  if errors.is(e) then
    local tb = { repl.describe_error(e) }
    for line in (frames or ""):gmatch("[^\n]+") do tb[#tb + 1] = line end
    return "MonarchError", tostring(e.kind) .. ": " .. tostring(e.message), tb
  end
  local text = tostring(e)
  local first = text:match("^[^\n]*")
  local tb = { "error: " .. first }
  for line in text:sub(#first + 2):gmatch("[^\n]+") do tb[#tb + 1] = line end
  return "LuaError", first, tb
end

-- ---- inspection ----------------------------------------------------------------

-- The source lines of a file, read once per inspection.
local function read_lines(path)
  local f = io.open(path, "r")
  if not f then return nil end
  local lines = {}
  for l in f:lines() do lines[#lines + 1] = l end
  f:close()
  return lines
end

-- The comment block right above line `at` of the file (the LDoc comment), and the line itself.
local function doc_above(path, at)
  local lines = read_lines(path)
  if not lines or not lines[at] then return nil end
  local i, doc = at - 1, {}
  while i >= 1 and lines[i]:match("^%s*%-%-") and #doc < M.MAX_DOC_LINES do
    table.insert(doc, 1, (lines[i]:gsub("^%s*%-%-+ ?", "")))
    i = i - 1
  end
  return lines[at], table.concat(doc, "\n")
end

--- Functions whose documentation is another's: a wrapper -> the function it wraps.
M.doc_for = setmetatable({}, { __mode = "k" })

--- What Shift-Tab shows for `name` (a dotted or `:` path) in env: its
-- type and value, and for a Lua function its definition line and the
-- comment above it. nil when the name does not resolve.
function M.inspect(name, env)
  local path = name:gsub(":", ".")
  local v = env
  for part in path:gmatch("[^.]+") do
    local ok, x = pcall(function() return v[part] end)
    if not ok or x == nil then return nil end
    v = x
  end
  if v == env then return nil end
  if type(v) ~= "function" then return fmt("%s: %s\n%s", name, type(v), repl.show(v)) end
  v = M.doc_for[v] or v
  local info = debug.getinfo(v, "S")
  if info.what == "C" or not info.source:match("^@") then return name .. ": a built-in function" end
  local file = info.source:sub(2)
  local def, doc = doc_above(file, info.linedefined)
  if not def then return fmt("%s: function at %s:%d", name, file, info.linedefined) end
  return fmt("%s\n%s\n\n%s:%d", def:gsub("^%s+", ""), doc, file, info.linedefined)
end

-- ---- a training run's curve ---------------------------------------------------

-- The picture of a run's figures so far (job:curves(), drawn as train's --plot draws them at the end);
-- nil before two steps are done, or when a figure is not a number yet (a NaN loss: the last picture stays).
local function curve_svg(job, title)
  local spec = job:plot_spec()
  if #spec.x.values < 2 or #spec.series == 0 then return nil end
  spec.title = title
  local ok, svg = pcall(require("monarch.plot").svg, spec)
  return ok and svg or nil
end

--- The notebook's train_live(spec [, args [, every]]): runs a training
-- script's spec with monarch.train.run, as `monarch-run script.lua args...`
-- would (args: a list of its options, e.g. {"--steps", "60"}), and shows
-- its curve (the spec's figures per step) in the cell, redrawn in place
-- every `every` steps (TRAIN_EVERY) and at the end. Returns the job. A bad
-- option, or what would end a script, is one error line (the kernel goes on).
function M.train_live(display, spec, args, every)
  if type(spec) ~= "table" then error("train_live: wants a training spec (a table for monarch.train.run)", 3) end
  if args ~= nil and type(args) ~= "table" then error("train_live: args wants a list of strings", 3) end
  if every ~= nil and (type(every) ~= "number" or every < 1) then
    error("train_live: every wants a number of steps, at least 1, got " .. tostring(every), 3)
  end
  local train = require "monarch.train"
  every = every or M.TRAIN_EVERY
  local title = spec.name or "training"
  local handle = display((spec.name and "training " .. spec.name or "training") .. " ...")
  local function redraw(job)
    local svg = curve_svg(job, title)
    if svg then handle:update(svg) end
  end
  local live, last, current = {}, nil, nil
  for k, v in pairs(spec) do live[k] = v end
  live.on_progress = function(job, s)
    current = job
    last = last or job.start_step
    if s - last >= every then
      last = s
      redraw(job)
    end
    if spec.on_progress then spec.on_progress(job, s) end
  end
  live.finish = function(job, ...)
    redraw(job)
    if spec.finish then return spec.finish(job, ...) end
  end
  local argv = { [0] = "train_live" }
  for i, a in ipairs(args or {}) do argv[i] = a end
  local ok, job = pcall(train.run, live, argv)
  if not ok then
    -- The picture says the run ended (its curve so far stays, where there is one), the error why.
    local drawn = current and select(2, pcall(curve_svg, current, title))
    if not drawn then handle:update(title .. ": stopped") end
    if errors.is(job) and job.kind == "train" then error(job.message, 0) end -- "train_live: ..."
    error(job, 0)
  end
  return job
end

-- ---- top() in a notebook -------------------------------------------------------

-- top's lines (monarch.top.lines) as an HTML table: the procs' cells in columns, the rest across.
local function top_html(top, lines)
  local cols = top.columns(M.TOP_COLS)
  local out = { "<table><thead><tr><th colspan=\"", #cols, "\">", esc((lines[1][1]:gsub("q quits", "interrupt to stop"))), "</th></tr><tr>" }
  for _, c in ipairs(cols) do out[#out + 1] = "<th>" .. esc(c[1]) .. "</th>" end
  out[#out + 1] = "</tr></thead><tbody>"
  for i = 3, #lines do
    local l = lines[i]
    local style = l[2] == "bad" and " style=\"color:#c62828\"" or l[2] == "head" and " style=\"font-weight:bold\"" or ""
    if l.values then
      out[#out + 1] = "<tr" .. style .. ">"
      for _, c in ipairs(cols) do
        out[#out + 1] = (c[4] == "r" and "<td style=\"text-align:right\">" or "<td>") ..
          esc(l.values[c[1]] or "-") .. "</td>"
      end
      out[#out + 1] = "</tr>"
    else
      out[#out + 1] = fmt("<tr%s><td colspan=\"%d\" style=\"text-align:left\">%s</td></tr>", style, #cols,
        esc((l[1] or ""):gsub("^%s+", "")))
    end
  end
  out[#out + 1] = "</tbody></table>"
  return table.concat(out)
end

local function top_bundle(top, v, t)
  local lines = top.lines(v, t, M.TOP_ROWS, M.TOP_COLS)
  local text = {}
  for i, l in ipairs(lines) do text[i] = l[1] end
  return { ["text/plain"] = table.concat(text, "\n"), ["text/html"] = top_html(top, lines) }
end

--- The notebook's top([{seconds = s}]): the live view of monarch's hosts as
-- one table, shown with display(bundle) and updated in place about once a
-- second, until the cell is interrupted (the stop button) or for s seconds;
-- then it returns quietly.
function M.top(monarch, display, opts)
  local seconds = opts and opts.seconds
  if seconds ~= nil and (type(seconds) ~= "number" or seconds <= 0) then
    error("top: seconds wants a positive number, got " .. tostring(seconds), 3)
  end
  local runtime = require "monarch.runtime"
  local top = require "monarch.top"
  local v = top.new(monarch.hosts().agents)
  local t = runtime.now()
  top.round(v, t)
  local next_round = t + top.INTERVAL
  local handle = display(top_bundle(top, v, t))
  local stop_at = seconds and t + seconds or math.huge
  while runtime.now() < stop_at do
    local ok, err = pcall(runtime.pump, M.TOP_POLL)
    if not ok then
      if errors.is(err) and err.kind == "interrupted" then return end
      if not errors.is(err) then error(err, 0) end
      table.insert(v.notes, tostring(err)) -- a failure of this controller's procs: shown, not fatal
      if #v.notes > top.MAX_NOTES then table.remove(v.notes, 1) end
    end
    t = runtime.now()
    local got = top.collect(v, t)
    if t >= next_round then
      top.round(v, t)
      next_round = t + top.INTERVAL
    end
    if got then handle:update(top_bundle(top, v, t)) end
  end
  handle:update(top_bundle(top, v, runtime.now()))
end

return M
