-- bench/load.lua: many no-op calls to one proc as fast as the controller can
-- issue them, futures dropped as it goes, to show that backpressure keeps
-- the calls in flight, and with them memory, bounded on both ends.
--   monarch-run bench/load.lua [calls] [every=N] [window=N] [quiet]
-- calls defaults to 10,000,000; every N-th future (default 100,000) is
-- waited on, the rest are dropped; window=N sets runtime.window (calls in
-- flight per proc, default 65536). Prints a progress line every second
-- (unless quiet) and ends with "key value" lines for bench/load.sh.
local monarch = require "monarch"
local core = require "monarch.core"
local runtime = require "monarch.runtime"

local N, every, quiet = 10000000, 100000, false
for _, a in ipairs(arg) do
  local k, v = a:match("^(%w+)=(%d+)$")
  if tonumber(a) then N = tonumber(a)
  elseif k == "every" then every = tonumber(v)
  elseif k == "window" then runtime.window = tonumber(v)
  elseif a == "quiet" then quiet = true
  else error("load.lua: unknown argument '" .. a .. "' (want calls, every=N, window=N, quiet)") end
end

--- Reads a "VmRSS:   1234 kB" style field of /proc/<pid>/status, in MiB.
local function vm(pid, field)
  local f = io.open("/proc/" .. pid .. "/status")
  if not f then return 0 end
  local s = f:read("*a")
  f:close()
  return (tonumber(s:match(field .. ":%s*(%d+)")) or 0) / 1024
end

local one = monarch.hosts():spawn_procs{ procs = 1 }
one:load "basic"
local p = one:proc_list()[1] -- the proc record: its connection and pid
local conn, pid = p.conn, p.pid

local base_ctl, base_proc = vm("self", "VmRSS"), vm(pid, "VmRSS")
local t0 = monarch.now()
local last_t, last_n = t0, 0
local max_inflight = 0
if not quiet then
  print(string.format("load: %d no-op calls to proc pid %d, waiting on every %d-th; window %d",
    N, pid, every, runtime.window))
  print(string.format("%8s %12s %10s %10s %11s %11s %11s %11s", "time_s", "calls", "calls/s", "inflight",
    "ctl_rss_mb", "ctl_hwm_mb", "proc_rss_mb", "proc_hwm_mb"))
end
for i = 1, N do
  local f = one:call_one("noop")
  if i % every == 0 or i == N then f:get() end
  if i % 1024 == 0 then
    local inflight = core.inflight(conn)
    if inflight > max_inflight then max_inflight = inflight end
    local now = monarch.now()
    if now - last_t >= 1 then
      if not quiet then
        print(string.format("%8.1f %12d %10.0f %10d %11.1f %11.1f %11.1f %11.1f", now - t0, i,
          (i - last_n) / (now - last_t), inflight, vm("self", "VmRSS"), vm("self", "VmHWM"),
          vm(pid, "VmRSS"), vm(pid, "VmHWM")))
      end
      last_t, last_n = now, i
    end
  end
end
local secs = monarch.now() - t0
-- Peaks are read before the proc is stopped: VmHWM is the process's own high-water mark.
print(string.format("calls %d", N))
print(string.format("seconds %.2f", secs))
print(string.format("calls_per_s %.0f", N / secs))
print(string.format("max_inflight %d", max_inflight))
print(string.format("window %d", runtime.window))
print(string.format("controller_start_rss_mb %.1f", base_ctl))
print(string.format("proc_start_rss_mb %.1f", base_proc))
print(string.format("controller_peak_rss_mb %.1f", vm("self", "VmHWM")))
print(string.format("proc_peak_rss_mb %.1f", vm(pid, "VmHWM")))
one:stop()
