-- bench/scale.lua: what a mesh-wide call costs the controller as the mesh grows.
--   monarch-run --hostfile F bench/scale.lua PROCS_PER_HOST [CALLS [IDLE_S]]
-- Run by bench/scale.sh, which starts the host agents (real ones, or
-- `monarch-worker --simulate` ones whose procs are virtual). Prints
-- "name value" lines.
local monarch = require "monarch"
local ffi = require "ffi"
local per, calls, idle = tonumber(arg[1] or "32"), tonumber(arg[2] or "40"), tonumber(arg[3] or "5")

local median = require("bench.stats").median

ffi.cdef [[
typedef struct { long tv_sec; long tv_usec; } mn_timeval_t;
typedef struct { mn_timeval_t ru_utime, ru_stime; long rest[14]; } mn_rusage_t;
int getrusage(int who, mn_rusage_t *usage);
int getpid(void);
struct mallinfo2 { size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost; };
struct mallinfo2 mallinfo2(void);
]]

-- This process's CPU seconds (user + system), to the microsecond: what the controller spent.
local ru = ffi.new("mn_rusage_t")
local function cpu_s()
  assert(ffi.C.getrusage(0, ru) == 0, "getrusage failed")
  return tonumber(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + tonumber(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6
end

-- The host agents' own CPU seconds (not their procs'), from /proc/PID/schedstat (nanoseconds on a CPU:
-- an agent's short bursts between clock ticks would show as nothing in /proc/PID/stat): on one machine,
-- what the hosts cost it. Agents on other machines count nothing.
local function agents_cpu_s(agents)
  local total, seen = 0, {}
  for _, a in ipairs(agents) do
    -- Simulated agents grouped in one process (monarch-worker --hosts) share its pid: count it once.
    local f = a.pid and not seen[a.pid] and io.open("/proc/" .. math.floor(a.pid) .. "/schedstat")
    if a.pid then seen[a.pid] = true end
    if f then
      total = total + (tonumber(f:read("*a"):match("^(%d+)")) or 0) / 1e9
      f:close()
    end
  end
  return total
end

local function status_kib(key)
  local f = assert(io.open("/proc/self/status"))
  local s = f:read("*a")
  f:close()
  return tonumber(s:match(key .. ":%s*(%d+)"))
end

local function collect()
  collectgarbage("collect")
  collectgarbage("collect")
end

-- Bytes in use: the Lua heap, C's malloc (glibc's count) and the controller's huge-page blocks of
-- connections (mapped outside malloc), after a full collection.
local function heap_bytes()
  local m = ffi.C.mallinfo2()
  return collectgarbage("count") * 1024 + tonumber(m.uordblks) + tonumber(m.hblkhd) +
    require("monarch.core").cast_stats().conn_bytes
end

local t0 = monarch.now()
local hosts = monarch.hosts()
-- SCALE_FANOUT=0: casts go to every agent directly (no tree); unset: the default fan-out.
if os.getenv("SCALE_FANOUT") then monarch.configure{ fanout = tonumber(os.getenv("SCALE_FANOUT")) } end
print(string.format("connect_s %.3f", monarch.now() - t0))
collect()
local rss0, heap0 = status_kib("VmRSS"), heap_bytes()

t0 = monarch.now()
local sc0, st0 = cpu_s(), require("monarch.core").cast_stats()
local procs = hosts:spawn_procs{ procs = per }
local sc1, st1 = cpu_s(), require("monarch.core").cast_stats()
procs:load "basic"
local spawn_s = monarch.now() - t0
local n = #hosts.agents * per
print(string.format("procs %d", n))
print(string.format("spawn_connect_s %.3f", spawn_s))
-- The spawn alone: the controller's CPU, and the SPAWN frames it wrote (one per top agent through the tree).
print(string.format("spawn_ctl_cpu_ms %.1f", (sc1 - sc0) * 1e3))
print(string.format("spawn_frames %d", #hosts.agents - (st1.spawn_relayed - st0.spawn_relayed)))

for _ = 1, 5 do procs:call("noop"):get() end
local lat, cpu = {}, {}
local a0 = agents_cpu_s(hosts.agents)
for b = 1, 5 do
  local c0, w0 = cpu_s(), monarch.now()
  for _ = 1, calls do procs:call("noop"):get() end
  lat[b] = (monarch.now() - w0) / calls * 1e3
  cpu[b] = (cpu_s() - c0) / calls * 1e3
end
print(string.format("agents_cpu_per_call_ms %.3f", (agents_cpu_s(hosts.agents) - a0) / (5 * calls) * 1e3))
print(string.format("call_gather_ms %.3f", median(lat)))
print(string.format("ctl_cpu_per_call_ms %.3f", median(cpu)))

-- Memory per proc, since the agents were connected, with one ValueMesh of the mesh alive, less that
-- ValueMesh's own Lua bytes (what any gather of n values must hold): the bytes in use (Lua heap and
-- malloc), and the resident set (which keeps what the collector freed, as the process grew to).
local vm = procs:call("noop"):get()
collect()
local rss1, heap1, lua1 = status_kib("VmRSS"), heap_bytes(), collectgarbage("count")
vm = nil
collect()
local vm_bytes = (lua1 - collectgarbage("count")) * 1024
print(string.format("valuemesh_bytes_per_proc %.0f", vm_bytes / n))
print(string.format("ctl_bytes_per_proc %.0f", (heap1 - heap0 - vm_bytes) / n))
print(string.format("ctl_rss_per_proc %.0f", ((rss1 - rss0) * 1024 - vm_bytes) / n))

-- Idle: the controller only keeps its heartbeats going.
local c0, w0 = cpu_s(), monarch.now()
monarch.sleep(idle)
print(string.format("ctl_idle_cpu_pct %.2f", (cpu_s() - c0) / (monarch.now() - w0) * 100))
print(string.format("ctl_peak_rss_mib %.1f", status_kib("VmHWM") / 1024))
local fds = io.popen("ls /proc/" .. ffi.C.getpid() .. "/fd | wc -l")
print(string.format("ctl_open_fds %d", tonumber(fds:read("*a"))))
fds:close()

-- Direct links (issue 14): pooled ones open now, and call_one on one proc of the mesh (its first call
-- goes through its agent while its link opens; once the link is up, calls take it).
print(string.format("ctl_direct_links %d", require("monarch.core").cast_stats().direct_links))
local one = procs:slice{ hosts = 0, procs = 0 }
one:call_one("noop"):get()
monarch.sleep(0.05)
local rtt = {}
for b = 1, 5 do
  local w1 = monarch.now()
  for _ = 1, 200 do one:call_one("noop"):get() end
  rtt[b] = (monarch.now() - w1) / 200 * 1e6
end
print(string.format("call_one_us %.1f", median(rtt)))
