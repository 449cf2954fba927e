--- Log aggregation: every proc's stdout and stderr reach the controller
-- (forwarded by its host agent), prefixed with host and rank. Identical
-- lines from many ranks within a short window collapse into one line that
-- names the ranks: "[vm r0-3] loss 0.25" instead of four lines.
--   monarch.log.level = "warn"    -- debug | info | warn | error
--   monarch.log.quiet = true      -- drop proc stdout (stderr still shows)
local runtime = require "monarch.runtime"

local M = { level = "info", quiet = false, window = 0.05 }
local LEVELS = { debug = 1, info = 2, warn = 3, error = 4 }
M.MAX_HELD = 1000    -- lines kept while output is held (monarch.top); later ones are only counted

local entries = {}   -- lines waiting for the window to close, in arrival order
local by_key = {}    -- stream .. "\0" .. line -> entry still open for more ranks
local flush_at       -- cancel function of the scheduled flush
M.last_output = 0    -- runtime.now() of the last line received
local held           -- while output is held: {file, text} to write afterwards
local dropped = 0    -- lines past MAX_HELD while held

local function emit(f, text)
  if not held then return f:write(text) end
  if #held < M.MAX_HELD then held[#held + 1] = { f, text } else dropped = dropped + 1 end
end

--- hold(true) keeps every line from the terminal (a full-screen view owns
-- it); hold(false) writes out what was kept, in order.
function M.hold(on)
  if on then
    held = held or {}
    return
  end
  local kept, n = held or {}, dropped
  held, dropped = nil, 0
  for _, e in ipairs(kept) do e[1]:write(e[2]) end
  if n > 0 then io.stderr:write(string.format("monarch: %d more lines of output were dropped while held\n", n)) end
  io.stdout:flush()
  io.stderr:flush()
end

local function enabled(level)
  return (LEVELS[level] or 2) >= (LEVELS[M.level] or 2)
end

--- Prints msg at level ("debug", "info", "warn", "error") with a "monarch:" prefix.
function M.log(level, msg)
  if enabled(level) then
    local f = (LEVELS[level] or 2) >= 3 and io.stderr or io.stdout
    emit(f, "monarch: " .. tostring(msg) .. "\n")
    f:flush()
  end
end

-- "0-3,5,7-8" from a sorted list of ranks.
local function ranges(ranks)
  table.sort(ranks)
  local out, i = {}, 1
  while i <= #ranks do
    local j = i
    while j < #ranks and ranks[j + 1] == ranks[j] + 1 do j = j + 1 end
    out[#out + 1] = i == j and tostring(ranks[i]) or (ranks[i] .. "-" .. ranks[j])
    i = j + 1
  end
  return table.concat(out, ",")
end

--- Writes out every waiting line.
function M.flush()
  if flush_at then flush_at() flush_at = nil end
  local batch = entries
  entries, by_key = {}, {}
  for _, e in ipairs(batch) do
    local hosts = {}
    for h in pairs(e.hosts) do hosts[#hosts + 1] = h end
    table.sort(hosts)
    local where = (#hosts == 1 and hosts[1] or (#hosts .. " hosts")) .. " r" .. ranges(e.ranks)
    local f = e.stream == 2 and io.stderr or io.stdout
    emit(f, "[" .. where .. "] " .. e.line .. "\n")
  end
  io.stdout:flush()
  io.stderr:flush()
end

--- Takes a LOG message's text (whole lines) from rank `rank` on `host`.
function M.proc_output(host, rank, stream, text)
  M.last_output = runtime.now()
  if stream == 1 and (M.quiet or not enabled("info")) then return end
  if stream == 2 and not enabled("warn") then return end
  for line in text:gmatch("([^\n]*)\n") do
    local key = stream .. "\0" .. line
    local e = by_key[key]
    if e == nil or e.seen[rank] then
      -- A rank repeating a line starts a new entry: its own order is kept.
      e = { line = line, stream = stream, ranks = {}, seen = {}, hosts = {} }
      by_key[key] = e
      entries[#entries + 1] = e
    end
    e.seen[rank] = true
    e.ranks[#e.ranks + 1] = rank
    e.hosts[host] = true
  end
  local tail = text:match("[^\n]+$") -- a piece of an over-long line
  if tail then entries[#entries + 1] = { line = tail, stream = stream, ranks = { rank }, seen = {}, hosts = { [host] = true } } end
  if not flush_at and #entries > 0 then flush_at = runtime.at(runtime.now() + M.window, M.flush) end
end

--- At exit: waits until procs have been quiet for a moment (bounded), then flushes.
function M.drain(quiet_for, max)
  local t0 = runtime.now()
  quiet_for, max = quiet_for or 0.1, max or 1.0
  while runtime.now() - math.max(M.last_output, t0) < quiet_for and runtime.now() - t0 < max do
    runtime.pump(0.02)
  end
  M.flush()
end

return M
