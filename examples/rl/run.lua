--- CartPole-v0 learned by REINFORCE, with the environments as Lua actors on
-- a mesh of procs, stepped in batches by a C kernel (kernels/cpu/cartpole.c).
--
--   monarch-run examples/rl/run.lua [--procs 3] [--envs 16] [--seed 1]   (--help lists the options)
--                                   [--kill-at UPDATE] [--kill-host-at UPDATE] [--restart] [--max-seconds 300]
--                                   [--plot FILE.svg] [--csv FILE.csv]
--   make rl
--
-- Prints progress about once a second (episodes, mean return over the last
-- 100, policy version, env steps per second) and, when the mean return of
-- 100 consecutive episodes reaches 195 (CartPole-v0's "solved"), the episodes
-- and wall time it took. --kill-at N kills one environment proc (SIGKILL)
-- after update N, to show rollouts going on without it; with --restart the
-- mesh restarts it and its actor comes back. --kill-host-at N (with two or more
-- hosts) kills the last host's agent after update N, and with it its env
-- procs: the host is reported once (host_lost) and rollouts go on on the other
-- hosts. A host that joins (monarch-run --listen-joins ADDR, then monarch-worker
-- --join ADDR) gets env procs and actors, which roll out from then on;
-- --wait-join-at N holds the learner after update N until one has. --plot writes the return of
-- every episode and its mean over the last 100 as an SVG line plot, --csv
-- the same per episode (with the env proc and the policy version) as CSV.
local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
local root = here:match("^(.*)/rl$") or (here == "rl" and ".") or (here .. "/..")
package.path = root .. "/?.lua;" .. package.path

local monarch = require "monarch"
local plot = require "monarch.plot"
local trainer = require "rl.trainer"

-- The command line, parsed as monarch.train parses a training script's (--help, one-line errors).
local topts = require "monarch.train_opts"
local OPTIONS = {
  { "procs", 3, "int", "env procs (on each host)", min = 1 },
  { "envs", 16, "int", "environments per env proc", min = 1 },
  { "seed", 1, "int", "seed of the environments and the policy" },
  { "max-seconds", 300, "number", "give up after this long" },
  { "restart", false, "flag", "restart a killed env proc (its actor comes back)" },
  { "kill-at", nil, "int", "testing: kill one env proc after update N" },
  { "kill-host-at", nil, "int", "testing: kill the last host's agent after update N" },
  { "wait-join-at", nil, "int", "testing: after update N, wait until a host has joined" },
  { "plot", nil, "string", "SVG file for the return of every episode and its mean over 100" },
  { "csv", nil, "string", "CSV file of the same, per episode" },
  { "help", false, "flag", "show this help" },
}
local parsed = topts.parse(arg or {}, OPTIONS, function(msg)
  io.stderr:write("run.lua: ", msg, "\n")
  os.exit(1)
end)
if parsed.help then
  print(topts.usage("examples/rl/run.lua", "CartPole-v0 by REINFORCE, environments as Lua actors on procs.", OPTIONS))
  return
end
local opts = {}
for k, v in pairs(parsed) do opts[k:gsub("-", "_")] = v end

local procs = monarch.hosts():spawn_procs { procs = opts.procs }
if opts.restart then procs = procs:options { restart = true } end
-- A lost env proc is expected here (rollouts go on without it): say so rather
-- than let the runtime stop the script for a failure nobody handled.
procs:on_failure(function(e)
  print(string.format("env proc rank %d lost: %s", e.rank or -1, tostring(e.cause or e.message)))
end)
monarch.on_host_loss(function(ev)
  print(string.format("env host %s lost (ranks %s): rollouts go on on the other hosts", ev.addr, table.concat(ev.ranks, ",")))
end)
-- Hosts that join: env procs on them, handed to the trainer at its next update.
local hosts, new_envs, joins = monarch.hosts(), {}, 0
-- --kill-host-at's: the last host the run started with (a host can join while the mesh is spawned: not that one).
local first_procs = procs:proc_list()
local victim_host = first_procs[#first_procs].agent
if hosts.on_join then
  local function take(a)
    local ok, grown, added = pcall(procs.grow, procs, { a })
    if not ok then -- the host went again before its procs were up: rollouts go on without it
      print(string.format("env host %s:%d joined but its env procs did not start: %s", a.addr, a.port, tostring(grown)))
      return
    end
    procs, joins = grown, joins + 1
    new_envs[#new_envs + 1] = added
    print(string.format("env host %s:%d joined: %d env procs added (ranks %s)", a.addr, a.port, added:size(),
      table.concat(added:rank(), ",")))
  end
  hosts:on_join(take)
  -- A host that joined while the first mesh was spawned has none of its procs, and came before the handler.
  local has = {}
  for _, p in ipairs(procs:proc_list()) do has[p.agent] = true end
  for _, a in ipairs(hosts.agents) do
    if not has[a] and a.state == "ready" then take(a) end
  end
  new_envs = {} -- the trainer starts with all of procs, these included
end
print(string.format("CartPole-v0: %d env procs x %d envs, REINFORCE (linear softmax policy)", procs:size(), opts.envs))

local killed = false
local curves = { episode = {}, ret = {}, mean100 = {}, rank = {}, version = {}, seconds = {} }
local function record(e)
  for k, col in pairs(curves) do col[#col + 1] = e[k] end
end
local summary = trainer.train {
  procs = procs, envs = opts.envs, seed = opts.seed, max_seconds = opts.max_seconds,
  on_episode = (opts.plot or opts.csv) and record or nil,
  new_envs = function()
    local l = new_envs
    new_envs = {}
    return l
  end,
  on_update = function(s)
    if s.updates % 10 == 0 then
      print(string.format("update %4d  episodes %6d  mean100 %6.1f  version %4d  steps/s %8.0f  lag %.2f  dropped %d",
        s.updates, s.episodes, s.mean100, s.version, s.steps_per_s, s.mean_lag, s.dropped))
    end
    if opts.kill_at and not killed and s.updates >= opts.kill_at then
      killed = true
      local victim = procs:procs()[#procs:procs()]
      print(string.format("killing env proc rank %d (pid %d) with SIGKILL", victim.rank, victim.pid))
      os.execute("kill -KILL " .. victim.pid)
    end
    if opts.wait_join_at and joins == 0 and s.updates >= opts.wait_join_at then
      if not hosts.on_join then error("--wait-join-at needs join support (monarch-run --listen-joins ADDR)", 0) end
      print("waiting for a host to join (monarch-worker --join)")
      local deadline = monarch.now() + 60
      while joins == 0 and monarch.now() < deadline do monarch.sleep(0.01) end
      if joins == 0 then error("--wait-join-at: no host joined within 60 s", 0) end
    end
    if opts.kill_host_at and not killed and s.updates >= opts.kill_host_at then
      killed = true
      if #hosts.agents < 2 then error("--kill-host-at needs two hosts or more (--hosts)", 0) end
      print(string.format("killing the env host agent at %s:%d (pid %d) with SIGKILL", victim_host.addr,
        victim_host.port, victim_host.pid))
      os.execute("kill -KILL " .. victim_host.pid)
    end
  end,
  on_env_failure = function(err, p)
    print(string.format("env proc rank %d failed (%s): dropped its rollout in flight; %s", err.rank or -1,
      tostring(err.cause or err.message), p.state == "dead" and "continuing on the others" or "waiting for its restart"))
  end,
}

if summary.solved then
  print(string.format("solved: mean return %.1f over the last 100 episodes after %d episodes, %.2f s wall " ..
    "(policy version %d, %.0f env steps/s, %d stale episodes dropped)", summary.solved_mean, summary.solved_episodes,
    summary.solved_seconds, summary.solved_version, summary.steps_per_s, summary.dropped))
else
  print(string.format("not solved within %.0f s: mean100 %.1f after %d episodes", summary.seconds, summary.mean100,
    summary.episodes))
end
local by_rank = {}
for r = 0, procs:size() - 1 do by_rank[#by_rank + 1] = string.format("rank %d: %d", r, summary.episodes_by_rank[r] or 0) end
print("episodes by env proc: " .. table.concat(by_rank, ", ") .. string.format("; %d env proc failure(s)", #summary.failures))

-- The curves: every episode that arrived (those in flight when the run
-- stopped included), in the order they arrived.
local function write(path, text)
  local ok, err = plot.write(path, text)
  if not ok then error(err, 0) end
end
if opts.csv then
  write(opts.csv, plot.csv({ "episode", "return", "mean100", "rank", "version", "seconds" },
    { curves.episode, curves.ret, curves.mean100, curves.rank, curves.version, curves.seconds }))
  print(string.format("csv: %s (%d episodes)", opts.csv, #curves.episode))
end
if opts.plot then
  local outcome = summary.solved and string.format("solved after %d episodes", summary.solved_episodes) or "not solved"
  write(opts.plot, plot.svg {
    title = string.format("CartPole-v0, REINFORCE, %d env procs x %d envs: %s", opts.procs, opts.envs,
      outcome),
    x = { label = "episode", values = curves.episode },
    y = { label = "return", min = 0, max = 200 },
    series = {
      { name = "return", values = curves.ret, colour = "#9cc3e6", width = 1 },
      { name = "mean of the last 100", values = curves.mean100, colour = "#e8710a", width = 2 },
    },
  })
  print(string.format("plot: %s (%d episodes)", opts.plot, #curves.episode))
end
monarch.shutdown()
if not summary.solved then os.exit(1) end
