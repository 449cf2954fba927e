-- bench/ray.lua: the measurements of bench/ray.sh (which says what they are).
local ffi = require "ffi"
local shell = require "support.shell"
local ray_cluster = require "support.ray_cluster"

pcall(ffi.cdef, [[
typedef struct { long tv_sec; long tv_nsec; } mn_bench_timespec;
int clock_gettime(int clk, mn_bench_timespec *ts);
int usleep(unsigned int us);
]])

local B = os.getenv("MONARCH_BUILD") or "build"
local RUNS = tonumber(arg[1]) or 5
local PART = arg[2] or "all" -- start, kill or all
local sh = shell.run

local function now() -- wall clock (CLOCK_REALTIME): compared with the times Ray's side reports
  local ts = ffi.new("mn_bench_timespec")
  ffi.C.clock_gettime(0, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

local function median(xs)
  local s = { unpack(xs) }
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2
end

local function timed(cmd)
  local t0 = now()
  local out, rc = sh(cmd)
  if rc ~= 0 then error("failed (rc " .. tostring(rc) .. "): " .. cmd .. "\n" .. out, 0) end
  return now() - t0, out
end

-- Runs cmd, reading its output as it comes: the seconds from t0 (default: now) to the first line
-- that matches pattern (the first call answered) and to the end of its output (the process exited).
local function timed_to(cmd, pattern, t0)
  t0 = t0 or now()
  local f = assert(io.popen(cmd .. " 2>&1; echo \"::rc=$?\""))
  local lines, t_line = {}, nil
  for line in f:lines() do
    if not t_line and line:find(pattern) then t_line = now() end
    lines[#lines + 1] = line
  end
  f:close()
  local t_end, out = now(), table.concat(lines, "\n")
  if tonumber(out:match("::rc=(%d+)%s*$")) ~= 0 or not t_line then
    error("failed, or no '" .. pattern .. "': " .. cmd .. "\n" .. out, 0)
  end
  return t_line - t0, t_end - t0
end

local py = assert(ray_cluster.python())
local token = (sh("head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'")):match("%x+")
local dir = (sh("mktemp -d /tmp/monarch-raybench.XXXXXX")):match("%S+")
local c
local FIRST = "first call" -- the line tests/support/ray_job.lua and bench/ray_actors.py print

-- The job on 3 agents started here, their start timed with it.
local function by_hand()
  local t0 = now()
  local addrs = {}
  for i = 1, 3 do
    local log = dir .. "/agent" .. i
    os.execute(("MONARCH_TOKEN=%s %s/bin/monarch-worker --listen 127.0.0.1:0 --once >%s 2>&1 &"):format(token, B, log))
  end
  for i = 1, 3 do
    local log, addr = dir .. "/agent" .. i, nil
    while not addr do
      addr = shell.exists(log) and shell.read(log):match("listening on (%S+:%d+)")
      if not addr then ffi.C.usleep(2000) end
    end
    addrs[i] = addr
  end
  local first, exit = timed_to(("MONARCH_TOKEN=%s %s/bin/monarch-run --hosts %s tests/support/ray_job.lua"):format(
    token, B, table.concat(addrs, ",")), FIRST, t0)
  for i = 1, 3 do os.remove(dir .. "/agent" .. i) end -- the next run's agents write new ones
  return first, exit
end

local function ratio_line(name, base, ours, target)
  return ("  %-30s %6.3f s | %6.3f s   ratio %5.2fx | %5.2fx%s"):format(name, base[1], base[2],
    ours[1] / base[1], ours[2] / base[2], target and "   (target <= " .. target .. ", to the first call)" or "")
end

local function start_bench()
  local cols = { ray = { {}, {} }, hand = { {}, {} }, actors = { {}, {} }, floor1 = { {}, {} }, floor3 = { {}, {} } }
  local ray_cmd = ("MONARCH_RAY_PYTHON=%s %s/bin/monarch-run --ray %s tests/support/ray_job.lua"):format(py, B, c.address)
  local runs = {
    ray = function() return timed_to(ray_cmd, FIRST) end,
    hand = by_hand,
    actors = function() return timed_to(("%s bench/ray_actors.py %s"):format(py, c.address), FIRST) end,
    floor1 = function() return timed_to(("%s bench/ray_actors.py %s floor 1"):format(py, c.address), FIRST) end,
    floor3 = function() return timed_to(("%s bench/ray_actors.py %s floor 3"):format(py, c.address), FIRST) end,
  }
  local order = { "ray", "hand", "actors", "floor1", "floor3" }
  timed_to(ray_cmd, FIRST) -- warm-up: the first driver of a cluster gets workers Ray started ahead
  for _ = 1, RUNS do -- interleaved, so a change in the machine's load falls on all alike
    for _, k in ipairs(order) do
      local a, b = runs[k]()
      table.insert(cols[k][1], a)
      table.insert(cols[k][2], b)
    end
  end
  local m = {}
  for k, v in pairs(cols) do m[k] = { median(v[1]), median(v[2]) } end
  print(("start 3 hosts x 2 procs + first mesh-wide call, median of %d (to the call's answer | to the process's exit):"):format(RUNS))
  print(("  %-30s %6.3f s | %6.3f s"):format("monarch-run --ray", m.ray[1], m.ray[2]))
  print(ratio_line("agents started by hand", m.hand, m.ray, "1.2x"))
  print(ratio_line("Ray's own actors (6)", m.actors, m.ray, "0.6x"))
  print(("Ray's own floor (a driver's start, ray.init, a placement group, trivial actors answering a call):"))
  print(("  %-30s %6.3f s | %6.3f s   %.1fx the job by hand, before any work of ours"):format(
    "1 actor", m.floor1[1], m.floor1[2], m.floor1[1] / m.hand[1]))
  print(("  %-30s %6.3f s | %6.3f s   ours %+.3f s against it (to the call)"):format(
    "3 actors, one per node", m.floor3[1], m.floor3[2], m.ray[1] - m.floor3[1]))
  if m.hand[1] * 1.2 < m.floor1[1] then
    print(("  1.2x by hand (%.3f s) is below Ray's 1-actor floor (%.3f s): out of reach for any job through Ray"):format(
      m.hand[1] * 1.2, m.floor1[1]))
  end
end

-- One kill: train.lua on the 3 nodes, node 3's raylet killed at step 400; node 3 is started again after.
local function kill_once(i)
  local out = dir .. "/train" .. i
  local data = shell.exists("data/digits.csv.gz") and "" or " --data " .. dir .. "/synthetic.csv"
  os.execute(("MONARCH_RAY_PYTHON=%s %s/bin/monarch-run --ray %s examples/train.lua --device cpu --procs 2 "
    .. "--steps 12000 --log-every 200 --checkpoint-dir %s/ck%s >%s 2>&1 &"):format(py, B, c.address, dir, data, out))
  while not (shell.exists(out) and shell.read(out):find("step 400/12000", 1, true)) do ffi.C.usleep(5000) end
  local alive = c:state().nodes
  local t_kill = c:kill_node(#c.nodes)
  local ray_file = dir .. "/raydead" .. i
  os.execute(("%s tests/ray/state.py %s dead-after %.6f %d >%s 2>&1 &"):format(py, c.address, t_kill, alive, ray_file))
  local t_step
  while true do
    local text = shell.read(out)
    if not t_step and text:find("stepping again", 1, true) then t_step = now() - t_kill end
    if text:find("checkpoint: ", 1, true) or text:find("monarch%-run: ") then break end
    ffi.C.usleep(5000)
  end
  while not shell.read(ray_file):match("dead [%d.]+") and not shell.read(ray_file):find("alive") do ffi.C.usleep(20000) end
  local ray_dead = tonumber(shell.read(ray_file):match("dead ([%d.]+)"))
  assert(t_step, "train.lua did not step again after the kill:\n" .. shell.read(out))
  c:add_node(1) -- back to 3 nodes for the next run
  return t_step, ray_dead
end

local function kill_bench()
  local ours, rays = {}, {}
  local n = math.max(1, math.min(RUNS, 3))
  for i = 1, n do ours[i], rays[i] = kill_once(i) end
  local o, r = median(ours), median(rays)
  print(("a node's raylet killed -> train.lua stepping again on the survivors, median of %d:"):format(n))
  print(("  ours (kill to stepping)    %7.3f s"):format(o))
  print(("  Ray marks the node dead    %7.3f s   target: ours < 2 s + Ray's = %.3f s (ours - Ray's = %.3f s)"):format(
    r, 2 + r, o - r))
end

local ok, err = pcall(function()
  if not shell.exists("data/digits.csv.gz") then
    require("support.digits").synthetic(dir .. "/synthetic.csv")
  end
  c = ray_cluster.start { nodes = 3, cpus = 1 }
  if PART ~= "kill" then start_bench() end
  if PART ~= "start" then kill_bench() end
end)
if c then c:stop() end
os.execute("rm -rf " .. dir)
if not ok then
  io.stderr:write("bench/ray.sh: ", tostring(err), "\n")
  os.exit(1)
end
