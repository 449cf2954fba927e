--- What a training run prints (monarch.train): a progress bar redrawn on
-- one line on a terminal, plain lines every --log-every steps otherwise,
-- with the script's own figures, the throughput and an ETA; and notes,
-- printed even with --quiet, that clear the bar first.
local ffi = require "ffi"

pcall(ffi.cdef, "int isatty(int fd);")

local M = {}
M.REDRAW = 0.1   -- seconds between redraws of the bar
M.WIDTH = 24     -- characters in the bar

local P = {}
P.__index = P

--- A progress printer. o: quiet, log_every, unit ("samples"), now (a clock function), out (a file; io.stdout).
function M.new(o)
  local out = o.out or io.stdout
  local tty = o.tty
  if tty == nil then tty = out == io.stdout and ffi.C.isatty(1) == 1 end
  return setmetatable({ quiet = o.quiet, log_every = o.log_every or 20, unit = o.unit or "samples", now = o.now,
    out = out, tty = tty, shown = false, last = 0 }, P)
end

function P:clear()
  if self.shown then
    self.out:write("\r\027[K")
    self.shown = false
  end
end

--- A line of the run (not with --quiet).
function P:say(fmt, ...)
  if self.quiet then return end
  self:clear()
  self.out:write(string.format(fmt, ...), "\n")
  self.out:flush()
end

--- A line printed even with --quiet: recovery, the summary.
function P:note(fmt, ...)
  self:clear()
  self.out:write(string.format(fmt, ...), "\n")
  self.out:flush()
end

local function clock(s)
  if s ~= s or s == math.huge then return "?" end
  s = math.floor(s + 0.5)
  if s >= 3600 then return string.format("%dh%02dm", s / 3600, s % 3600 / 60) end
  if s >= 60 then return string.format("%dm%02ds", s / 60, s % 60) end
  return s .. "s"
end

-- "name value" pairs in the order the script gave them (a list of {name, value, format}).
local function figures(list)
  local parts = {}
  for _, f in ipairs(list or {}) do parts[#parts + 1] = string.format("%s " .. (f[3] or "%.4f"), f[1], f[2]) end
  return table.concat(parts, "  ")
end

--- After step s of total (1-based count of steps done): epoch e of epochs, the figures, the rate (units per
-- second of step time) and the seconds left at that rate of steps.
function P:step(s, total, e, epochs, figs, rate, left)
  if self.quiet then return end
  local line = string.format("step %d/%d  epoch %d/%d  %s  %6.0f %s/s", s, total, e, epochs, figures(figs), rate,
    self.unit)
  if self.tty then
    local now = self.now()
    if now - self.last < M.REDRAW and s < total then return end
    self.last = now
    local filled = math.floor(M.WIDTH * s / total)
    self.out:write("\r\027[K[", string.rep("=", filled), string.rep(" ", M.WIDTH - filled), "] ", line,
      "  eta ", clock(left))
    self.out:flush()
    self.shown = true
  elseif s % self.log_every == 0 then
    self.out:write(line, "  eta ", clock(left), "\n")
    self.out:flush()
  end
end

M.clock = clock
return M
