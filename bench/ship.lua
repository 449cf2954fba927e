-- bench/ship.lua: shipping kernel libraries and files to the hosts (issue 30). Run by bench/ship.sh:
--   monarch-run --hostfile F bench/ship.lua real DIR BASE REPS [NAME]   libraries DIR/NAME_I.so (NAME: ship;
--                                                hosts cannot see them) next to BASE/base_I.so (they can)
--   monarch-run --hostfile F bench/ship.lua sim LIB         one first load on (simulated) hosts
--   monarch-run --hostfile F bench/ship.lua sync DIR        a folder synced, one file changed, synced again
-- Prints "name value" lines.
local monarch = require "monarch"
local median = require("bench.stats").median
local mode = arg[1]

local function timed(fn)
  local t = monarch.now()
  fn()
  return (monarch.now() - t) * 1000
end

-- The load as it was before shipping: __load(path) on every proc, the file already on each host.
local function local_load(m, path)
  m:_submit("__load", { path }, 1, { what = "load of '" .. path .. "'" }):get(60)
end

local function size_of(path)
  local f = assert(io.open(path, "rb"))
  local n = f:seek("end")
  f:close()
  return n
end

if mode == "real" then
  local dir, base, reps, name = arg[2], arg[3], tonumber(arg[4] or "5"), arg[5] or "ship"
  local hosts = monarch.hosts()
  local a, b = hosts:spawn_procs{ procs = 1 }, hosts:spawn_procs{ procs = 1 }
  local loc, first, second, loc2, bytes, hash = {}, {}, {}, {}, {}, {}
  local core = require "monarch.core"
  for i = 1, reps do
    local lib = dir .. "/" .. name .. "_" .. i .. ".so"
    loc[i] = timed(function() local_load(a, base .. "/base_" .. i .. ".so") end)
    local before = monarch.ship.stats().bytes
    first[i] = timed(function() a:load(lib) end)
    bytes[i] = monarch.ship.stats().bytes - before
    -- From the hosts' caches, against the local load on the same mesh. Whichever of the two comes first after
    -- the first load waits for its aftermath (and mesh b's procs, idle until then, to wake): they take turns.
    local function cached() second[i] = timed(function() b:load(lib) end) end
    local function plain() loc2[i] = timed(function() local_load(b, base .. "/base_" .. i .. ".so") end) end
    if i % 2 == 1 then cached() plain() else plain() cached() end
    local f = assert(io.open(lib, "rb"))
    local bytes_of = f:read("*a")
    f:close()
    hash[i] = timed(function() core.ship_hash(bytes_of) end)
  end
  print("hosts", #hosts.agents)
  print("lib_bytes", size_of(dir .. "/" .. name .. "_1.so"))
  print("hash_ms", median(hash))
  print("local_ms", median(loc))
  print("first_ms", median(first))
  print("ctl_copies", median(bytes) / size_of(dir .. "/ship_1.so"))
  print("local2_ms", median(loc2))
  print("second_ms", median(second))
elseif mode == "sim" then
  local lib = arg[2]
  -- 64 simulated hosts share a process and its loop: hashing their copies keeps one relay link unread for
  -- longer than a real host would; a longer heartbeat (the links' silence limit is half of it) keeps them up.
  local hosts = monarch.hosts()
  monarch.configure{ heartbeat_timeout = tonumber(os.getenv("SHIP_HEARTBEAT") or "10") }
  local m = hosts:spawn_procs{ procs = 1 }
  local core = require "monarch.core"
  -- The tree's links come up after the spawn; a few casts later every host below the top takes its parent's.
  local deadline = monarch.now() + 30
  repeat m:call("noop"):get(60) until core.cast_stats().routed >= core.cast_stats().tree_agents - 16 or monarch.now() > deadline
  local before = monarch.ship.stats().bytes
  local ms = timed(function() m:load(lib) end)
  print("hosts", #hosts.agents)
  print("routed", core.cast_stats().routed)
  print("first_ms", ms)
  print("ctl_copies", (monarch.ship.stats().bytes - before) / size_of(lib))
  print("second_ms", timed(function() m:load(lib) end))
elseif mode == "sync" then
  local dir = arg[2]
  local hosts = monarch.hosts()
  local t0 = monarch.now()
  local r1 = hosts:sync{ dir }
  local first_ms = (monarch.now() - t0) * 1000
  local f = assert(io.open(dir .. "/small.txt", "wb"))
  f:write(string.rep("changed ", 128)) -- 1 KiB
  f:close()
  t0 = monarch.now()
  local r2 = hosts:sync{ dir }
  print("files", r1.files)
  print("first_bytes", r1.bytes)
  print("first_ms", first_ms)
  print("second_bytes", r2.bytes)
  print("second_shipped", r2.shipped)
  print("second_ms", (monarch.now() - t0) * 1000)
else
  error("bench/ship.lua: mode real, sim or sync")
end
