-- bench/actors.lua: Lua actors next to kernels, and CartPole env steps per
-- second across a mesh of env actors.
--   monarch-run bench/actors.lua [quick]
-- Prints "name value" lines (medians of several batches), like bench/core.lua.
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = here .. "/../examples/?.lua;" .. package.path

local monarch = require "monarch"
local quick = arg and arg[1] == "quick"

local median = require("bench.stats").median

local PING = [[
local P = {}
function P.new() return P end
function P.ping() end
function P.echo(_, ...) return ... end
-- n local kernel calls from Lua, timed inside the proc.
function P.local_calls(_, n)
  local t0 = os.clock()
  for _ = 1, n do proc.call("noop") end
  return (os.clock() - t0) / n
end
return P
]]

local hosts = monarch.hosts()
local one = hosts:spawn_procs { procs = 1 }
one:load "basic"
local p = one:spawn("ping", { source = PING, name = "bench_ping" })

-- Round trips, one at a time, on the same proc: the kernel, the actor
-- endpoint, and an endpoint echoing 100 numbers. Batches of the three are
-- interleaved so that they see the same machine.
local batches, per = quick and 5 or 10, quick and 500 or 2000
local payload = {}
for i = 1, 100 do payload[i] = i + 0.5 end
local probes = {
  { "kernel_rtt_us", function() one:call_one("noop"):get() end },
  { "actor_rtt_us", function() p:call_one("ping"):get() end },
  { "actor_echo100_rtt_us", function() p:call_one("echo", payload):get() end },
}
local times = {}
for _, pr in ipairs(probes) do
  for _ = 1, 300 do pr[2]() end
  times[pr[1]] = {}
end
for b = 1, batches do
  for _, pr in ipairs(probes) do
    local t0 = monarch.now()
    for _ = 1, per do pr[2]() end
    times[pr[1]][b] = (monarch.now() - t0) / per * 1e6
  end
end
for _, pr in ipairs(probes) do print(string.format("%s %.2f", pr[1], median(times[pr[1]]))) end
local lc = {}
for b = 1, batches do lc[b] = p:call_one("local_calls", 100000):get() * 1e9 end
print(string.format("proc_call_from_lua_ns %.1f", median(lc)))
one:stop()

-- CartPole env steps per second: every env actor steps its batch with a
-- fixed policy (the policy evaluated in Lua on the proc, the physics in C).
local nprocs, envs = 3, 64
local procs = hosts:spawn_procs { procs = nprocs }
procs:load "cartpole"
local actors = procs:spawn("env", "rl.cartpole_env", { envs = envs }, { deps = { "rl.policy" } })
local params = { 0.1, 0.5, 5.0, 1.0, 0 }
local steps = quick and 200 or 1000
actors:call("run", params, 50):get() -- warm up the JIT
local rates, one_rates = {}, {}
for r = 1, quick and 3 or 5 do
  local t0 = monarch.now()
  local vm = actors:call("run", params, steps):get()
  local total = 0
  for _, v in vm:items() do total = total + v[1] end
  rates[r] = total / (monarch.now() - t0)
  t0 = monarch.now()
  local n = actors:slice { procs = 0 }:call_one("run", params, steps):get()[1]
  one_rates[r] = n / (monarch.now() - t0)
end
print(string.format("env_steps_per_s_mesh %.0f", median(rates)))
print(string.format("env_steps_per_s_one_actor %.0f", median(one_rates)))
print(string.format("env_mesh %d procs x %d envs", nprocs, envs))

-- What training sees: rollouts that record every observation and ship the episodes home.
local rr = {}
for r = 1, quick and 3 or 5 do
  local t0 = monarch.now()
  local vm = actors:call("rollout", params, 0, 64):get()
  local total = 0
  for _, v in vm:items() do
    for _, ep in ipairs(v.episodes) do total = total + #ep.actions end
  end
  rr[r] = total / (monarch.now() - t0)
end
print(string.format("rollout_steps_per_s_mesh %.0f", median(rr)))
procs:stop()
monarch.shutdown()
