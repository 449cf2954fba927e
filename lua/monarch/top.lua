--- monarch.top: a live full-screen view of every host and proc of this
-- job's hosts, refreshed about once a second, until q or Ctrl-C:
-- `monarch-run --top --hosts ...`, or top() in the REPL.
--   monarch.top()                -- the hosts of monarch.hosts()
--   monarch.top{ retry = true }  -- also reconnect to a host that was lost (monarch-run --top)
--
-- Each refresh asks every host agent for its STATUS (docs/protocol.md,
-- section 5), which lists per proc its state, calls queued and run, the
-- kernel running and for how long, CPU time, resident and GPU memory, and
-- the host's recent exits. Calls per second and CPU % are differences
-- between two reports: calls over the agent's clock of the procs' status
-- lines, CPU over ours. A host that does not answer is shown so while the
-- others keep refreshing. The screen is ncurses (monarch.term, built into
-- monarch-run); this module builds its lines, which tests can read.
local core = require "monarch.core"
local errors = require "monarch.errors"
local persist = require "monarch.persist"
local procs_mod = require "monarch.procs"
local runtime = require "monarch.runtime"

local M = {}
M.INTERVAL = 1         -- seconds between refreshes
M.SILENT = 3           -- seconds without an answer before a host shows as not answering
M.RETRY = 2            -- seconds between attempts to reach a lost host (with retry)
M.MIN_COLS, M.MIN_ROWS = 60, 5 -- the smallest terminal the view fits in
M.MAX_FAILURES = 5     -- recent failures shown per host
M.MAX_NOTES = 5        -- this controller's own failures kept on screen
local KEY_POLL = 0.05  -- seconds between looks at the keyboard

-- ---- formatting ------------------------------------------------------------------

--- "0.4s", "42s", "3m07s", "2h05m"; "-" for nil.
function M.duration(s)
  if s == nil then return "-" end
  if s < 10 then return string.format("%.1fs", s) end
  if s < 60 then return string.format("%.0fs", s) end
  if s < 3600 then return string.format("%dm%02ds", math.floor(s / 60), math.floor(s % 60)) end
  return string.format("%dh%02dm", math.floor(s / 3600), math.floor(s % 3600 / 60))
end

--- "512B", "12.3K", "1.5G"; "-" for nil.
function M.bytes(n)
  if n == nil then return "-" end
  if n < 1024 then return string.format("%dB", n) end
  for _, u in ipairs { "K", "M", "G", "T" } do
    n = n / 1024
    if n < 1024 or u == "T" then return string.format(n < 10 and "%.1f%s" or "%.0f%s", n, u) end
  end
end

local function rate(r)
  if r == nil then return "-" end
  return r < 10 and string.format("%.1f", r) or string.format("%.0f", r)
end

-- ---- samples: rates from two reports ------------------------------------------------

--- The sample of proc report p received at time t, given the proc's previous
-- sample (or nil): executed, the time of its status line, cpu seconds, and
-- the rates rate (calls/s) and cpu_pct. Calls are timed by the status lines
-- (t minus their age): a report with no new line since the previous one
-- keeps the previous base, so the next rate spans both intervals.
function M.sample(prev, p, t)
  local s = { executed = p.executed, line_t = t - (p.status_age or 0), cpu = p.cpu, t = t }
  if not prev then return s end
  local dt = s.line_t - prev.line_t
  if dt > 0.05 then
    s.rate = math.max(0, (p.executed - prev.executed) / dt)
  else
    s.rate, s.line_t, s.executed = prev.rate, prev.line_t, prev.executed
  end
  local ct = t - prev.t
  if p.cpu and prev.cpu and ct > 0.05 then
    s.cpu_pct = math.max(0, (p.cpu - prev.cpu) / ct * 100)
  else
    s.cpu_pct, s.cpu, s.t = prev.cpu_pct, prev.cpu, prev.t
  end
  return s
end

-- ---- the view ---------------------------------------------------------------------

--- A view of the hosts of `agents` (the agent records of a HostMesh).
-- opts.retry: reconnect to hosts that were lost.
function M.new(agents, opts)
  local v = { hosts = {}, notes = {}, offset = 0, retry = opts and opts.retry }
  for i, a in ipairs(agents) do v.hosts[i] = { agent = a, seen = {} } end
  return v
end

--- Takes host h's STATUS report v, received at time t.
function M.took(h, v, t)
  local seen = {}
  for _, p in ipairs(v.procs or {}) do seen[p.pid] = M.sample(h.seen[p.pid], p, t) end
  table.sort(v.procs, function(x, y) return x.rank < y.rank or (x.rank == y.rank and x.pid < y.pid) end)
  h.seen, h.report, h.got_at, h.error = seen, v, t, nil
end

local function status_msg(req) return { core.MSG.STATUS, req } end

--- One refresh at time t: asks every connected host that has no question
-- pending, and (with retry) starts reconnecting to lost ones.
function M.round(v, t)
  for _, h in ipairs(v.hosts) do
    local a = h.agent
    if h.req and (a.state ~= "ready" or a.conn ~= h.req.conn) then
      persist.forget(h.req)
      h.req = nil
    end
    if a.state == "ready" and not h.req then
      h.req, h.sent_at = persist.request(a, status_msg), t
    elseif a.state == "dead" and v.retry and t - (h.tried_at or -math.huge) >= M.RETRY then
      h.tried_at = t
      procs_mod.connect_agent(a)
    end
  end
end

--- Takes the answers that arrived; true if any did.
function M.collect(v, t)
  local any = false
  for _, h in ipairs(v.hosts) do
    local r = h.req
    if r and r.done then
      h.req = nil
      if r.ok then M.took(h, r.value, t) else h.error = tostring(r.value) end
      any = true
    end
  end
  return any
end

-- ---- lines ------------------------------------------------------------------------

-- The proc table's columns in display order. prio: which go first when the
-- terminal is narrow (1 stays longest).
local COLUMNS = {
  { "RANK", 4, 1, "r" }, { "PID", 7, 7, "r" }, { "STATE", 8, 2 }, { "CALLS/S", 8, 3, "r" },
  { "QUEUE", 5, 5, "r" }, { "RUNNING", 16, 4 }, { "FOR", 6, 4, "r" }, { "CPU%", 6, 5, "r" },
  { "RSS", 7, 6, "r" }, { "GPU MEM", 7, 6, "r" }, { "UPTIME", 7, 9, "r" }, { "HELD", 11, 8 },
}
local INDENT = "  "
M.COLUMNS = COLUMNS -- {name, width, priority, "r" when right-aligned}

--- The columns that fit in `cols` characters, in display order.
function M.columns(cols)
  local order = {}
  for i, c in ipairs(COLUMNS) do order[i] = i end
  table.sort(order, function(x, y) return COLUMNS[x][3] < COLUMNS[y][3] or (COLUMNS[x][3] == COLUMNS[y][3] and x < y) end)
  local take, width = {}, #INDENT
  for _, i in ipairs(order) do
    local w = COLUMNS[i][2] + (width > #INDENT and 1 or 0)
    if width + w <= cols then
      take[i], width = true, width + w
    end
  end
  local out = {}
  for i, c in ipairs(COLUMNS) do if take[i] then out[#out + 1] = c end end
  return out
end

local function row(cols, values)
  local cells = {}
  for i, c in ipairs(cols) do
    local s = tostring(values[c[1]] or "-")
    if #s > c[2] then s = s:sub(1, c[2]) end
    cells[i] = c[4] == "r" and string.rep(" ", c[2] - #s) .. s or s .. string.rep(" ", c[2] - #s)
  end
  return (INDENT .. table.concat(cells, " ")):gsub("%s+$", "")
end

-- The STATE column of proc report p, and its style.
local function proc_state(p)
  if p.hung then return "hung", "bad" end
  if p.ready == false then return "starting" end
  if p.state == "stopping" then return "stopping", "dim" end
  return "ready"
end

local function proc_line(cols, p, s)
  local state, style = proc_state(p)
  local busy = p.running ~= nil and p.running ~= "-"
  local values = {
    RANK = p.rank, PID = p.pid, STATE = state, ["CALLS/S"] = rate(s and s.rate), QUEUE = p.queued,
    RUNNING = p.running, FOR = busy and M.duration(p.running_for) or "-",
    ["CPU%"] = s and s.cpu_pct and string.format("%.0f", s.cpu_pct) or "-", RSS = M.bytes(p.rss),
    ["GPU MEM"] = M.bytes(p.gpu_mem), UPTIME = M.duration(p.uptime), HELD = p.state .. (p.mine and "*" or ""),
  }
  return { row(cols, values), style, values = values } -- values: the cells, for an HTML table (the notebook's top())
end

local function exit_cause(e)
  if e.signal ~= nil and e.signal ~= "" then return "killed by SIG" .. e.signal end
  return "exited with code " .. tostring(e.status)
end

local function is_failure(e) return (e.signal ~= nil and e.signal ~= "") or (e.status or 0) ~= 0 end

-- Lines of host h at time t into out; returns its calls per second.
local function host_lines(out, cols, h, t)
  local a, v = h.agent, h.report
  local where = a.addr .. ":" .. a.port
  local name = v and v.hostname and string.format("host %s (%s)", v.hostname, where) or where
  local why
  if a.state == "reconnecting" then why = "reconnecting (" .. tostring(a.reason or "connection lost") .. ")"
  elseif a.state ~= "ready" then why = tostring(a.reason or a.state)
  elseif h.req and t - h.sent_at > M.SILENT then why = "no answer for " .. M.duration(t - h.sent_at)
  elseif h.error then why = "error: " .. h.error end
  if why then
    out[#out + 1] = { name .. "  unreachable: " .. why, "bad" }
    return 0
  end
  if not v then
    out[#out + 1] = { name .. "  waiting for its first report", "head" }
    return 0
  end
  local total = 0
  for _, p in ipairs(v.procs) do total = total + ((h.seen[p.pid] or {}).rate or 0) end
  local blas = type(v.blas) == "table" and v.blas.core ~= "?"
    and string.format("  blas %s%s %.0f GF/s", v.blas.core, require("monarch.status").blas_generic(v.blas.core)
      and " (generic)" or "", v.blas.gflops or 0) or ""
  out[#out + 1] = { string.format("%s  agent pid %d  up %s  %d procs  %s calls/s%s", name, v.pid, M.duration(v.uptime),
    #v.procs, rate(total), blas), "head" }
  for _, p in ipairs(v.procs) do out[#out + 1] = proc_line(cols, p, h.seen[p.pid]) end
  local failures = {}
  for _, e in ipairs(v.exits or {}) do if is_failure(e) then failures[#failures + 1] = e end end
  for i, e in ipairs(failures) do
    if i > M.MAX_FAILURES then
      out[#out + 1] = { string.format("%s... %d more failures", INDENT, #failures - M.MAX_FAILURES), "bad" }
      break
    end
    out[#out + 1] = { string.format("%sfailed: rank %d pid %d %s, %s ago", INDENT, e.rank, e.pid, exit_cause(e),
      M.duration(e.ago)), "bad" }
  end
  return total
end

--- The screen of view v at time t on a rows x cols terminal: a list of
-- lines, each {text, style}.
function M.lines(v, t, rows, cols)
  if rows < M.MIN_ROWS or cols < M.MIN_COLS then
    return { { string.format("terminal too small (%dx%d): top needs %dx%d", cols, rows, M.MIN_COLS, M.MIN_ROWS), "bad" } }
  end
  local tcols = M.columns(cols)
  local body, total, nprocs = {}, 0, 0
  for i, h in ipairs(v.hosts) do
    if i > 1 then body[#body + 1] = { "" } end
    total = total + host_lines(body, tcols, h, t)
    nprocs = nprocs + (h.report and h.agent.state == "ready" and #h.report.procs or 0)
  end
  for _, n in ipairs(v.notes) do body[#body + 1] = { "this controller: " .. n, "bad" } end
  local heads = {}
  for _, c in ipairs(tcols) do heads[c[1]] = c[1] end
  local out = {
    { string.format("monarch top  %s  %d hosts  %d procs  %s calls/s   q quits", os.date("%H:%M:%S"), #v.hosts,
      nprocs, rate(total)), "title" },
    { row(tcols, heads), "head" },
  }
  local room = rows - #out
  local fits = #body <= room
  if not fits then room = room - 1 end -- the last row says what is out of view
  v.offset = math.max(0, math.min(v.offset, #body - room))
  for i = v.offset + 1, math.min(#body, v.offset + room) do out[#out + 1] = body[i] end
  if not fits then
    out[#out + 1] = { string.format("-- lines %d-%d of %d: arrows and PgUp/PgDn scroll --", v.offset + 1,
      v.offset + room, #body), "dim" }
  end
  v.page = room
  return out
end

--- Moves the view for a scrolling key; false for any other key.
function M.scroll(v, key)
  local page = math.max(1, (v.page or 10) - 1)
  local moves = { up = -1, down = 1, pgup = -page, pgdn = page, home = -math.huge, ["end"] = math.huge }
  if not moves[key] then return false end
  v.offset = math.max(0, math.min(v.offset + moves[key], 1e9)) -- M.lines clamps it to what there is
  return true
end

-- ---- running it ---------------------------------------------------------------------

-- One turn of the loop; a failure of this controller's own procs (the REPL's)
-- is shown on the screen instead of ending the view.
local function pump(v, timeout)
  local ok, err = pcall(runtime.pump, timeout)
  if ok then return end
  if not errors.is(err) then error(err, 0) end
  table.insert(v.notes, tostring(err))
  if #v.notes > M.MAX_NOTES then table.remove(v.notes, 1) end
end

local QUIT = { q = true, Q = true, ["ctrl-c"] = true }

--- Refreshes view v on screen scr until a quitting key.
function M.loop(v, scr)
  local next_round, dirty = 0, true
  while true do
    local t = runtime.now()
    if t >= next_round then
      M.round(v, t)
      next_round, dirty = t + M.INTERVAL, true
    end
    local key = scr:key()
    while key do
      if QUIT[key] then return end
      M.scroll(v, key)
      dirty = true
      key = scr:key()
    end
    if M.collect(v, runtime.now()) then dirty = true end
    if dirty then
      scr:draw(M.lines(v, runtime.now(), scr:size()))
      dirty = false
    end
    pump(v, KEY_POLL)
  end
end

--- Shows the live view of monarch's hosts until q or Ctrl-C, then restores
-- the terminal. opts.retry: reconnect to hosts that were lost. What procs
-- print meanwhile is held and printed afterwards; failures of this
-- controller's own procs are shown, then printed to stderr.
function M.run(monarch, opts)
  local has_term, term = pcall(require, "monarch.term")
  if not has_term then error("monarch.top needs monarch-run: its screen (monarch.term) is part of it", 3) end
  local agents = monarch.hosts().agents -- connected before the screen takes the terminal
  local scr, why = term.open()
  if not scr then error("monarch.top cannot open the screen: " .. why, 3) end
  local log = require "monarch.log"
  log.hold(true)
  local v = M.new(agents, opts)
  local ok, err = pcall(M.loop, v, scr)
  scr:close()
  log.hold(false)
  for _, n in ipairs(v.notes) do io.stderr:write("monarch: while top ran: ", n, "\n") end
  if not ok then error(err, 0) end
end

return M
