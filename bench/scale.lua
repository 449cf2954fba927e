-- bench/scale.lua: what a mesh-wide call costs the controller as the mesh grows.
--   monarch-run --hostfile F bench/scale.lua PROCS_PER_HOST [CALLS]
-- Run by bench/scale.sh, which starts the host agents. Prints "name value" lines.
local monarch = require "monarch"
local per, calls = tonumber(arg[1] or "32"), tonumber(arg[2] or "40")

local median = require("bench.stats").median

-- This process's CPU seconds (user + system, every thread), from getrusage: microseconds, where
-- /proc's ticks (10 ms) would round a millisecond per call away.
local ffi = require "ffi"
ffi.cdef [[
  struct mn_timeval { long tv_sec; long tv_usec; };
  struct mn_rusage { struct mn_timeval ru_utime, ru_stime; long pad[14]; };
  int getrusage(int who, struct mn_rusage *usage);
]]
local ru = ffi.new("struct mn_rusage")
local function cpu_s()
  assert(ffi.C.getrusage(0, ru) == 0) -- RUSAGE_SELF
  return tonumber(ru.ru_utime.tv_sec) + tonumber(ru.ru_utime.tv_usec) / 1e6 + tonumber(ru.ru_stime.tv_sec) +
         tonumber(ru.ru_stime.tv_usec) / 1e6
end

local function status_kib(key)
  local f = assert(io.open("/proc/self/status"))
  local s = f:read("*a")
  f:close()
  return tonumber(s:match(key .. ":%s*(%d+)"))
end

local hosts = monarch.hosts()
-- SCALE_FANOUT=0: casts go to every agent directly (no tree); unset: the default fan-out.
if os.getenv("SCALE_FANOUT") then monarch.configure{ fanout = tonumber(os.getenv("SCALE_FANOUT")) } end
local t0 = monarch.now()
local procs = hosts:spawn_procs{ procs = per }
procs:load "basic"
local spawn_s = monarch.now() - t0
local n = #hosts.agents * per
print(string.format("procs %d", n))
print(string.format("spawn_connect_s %.3f", spawn_s))

for _ = 1, 5 do procs:call("noop"):get() end
local lat, cpu = {}, {}
for b = 1, 5 do
  local c0, w0 = cpu_s(), monarch.now()
  for _ = 1, calls do procs:call("noop"):get() end
  lat[b] = (monarch.now() - w0) / calls * 1e3
  cpu[b] = (cpu_s() - c0) / calls * 1e3
end
print(string.format("call_gather_ms %.3f", median(lat)))
print(string.format("ctl_cpu_per_call_ms %.3f", median(cpu)))

-- Idle: the controller only keeps its heartbeats going.
local idle = 5
local c0, w0 = cpu_s(), monarch.now()
monarch.sleep(idle)
print(string.format("ctl_idle_cpu_pct %.2f", (cpu_s() - c0) / (monarch.now() - w0) * 100))
print(string.format("ctl_peak_rss_mib %.1f", status_kib("VmHWM") / 1024))
ffi.cdef "int getpid(void);"
local fds = io.popen("ls /proc/" .. ffi.C.getpid() .. "/fd | wc -l")
print(string.format("ctl_open_fds %d", tonumber(fds:read("*a"))))
fds:close()
