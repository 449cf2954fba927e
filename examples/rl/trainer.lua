--- Asynchronous rollouts and learning for CartPole: one generator task per
-- environment actor keeps asking it for episodes with the newest policy it
-- has, while the learner (on the controller, in the caller's thread) updates
-- whenever a batch is queued. A generator never waits for the learner and
-- the learner never waits for a particular generator; episodes more than
-- max_staleness versions old are dropped.
--
-- If an environment proc fails, its generator drops the rollout it had in
-- flight and, when the mesh restarts procs (options{restart = true}), goes on
-- with the replacement (the actor is spawned there again by the restart
-- hook of monarch.actor); otherwise it stops and the others carry on.
--
--   local summary = require("rl.trainer").train{ procs = procs, envs = 16, target = 195 }
local monarch = require "monarch"
local Learner = require "rl.learner"

local M = {}

local WINDOW = 100 -- episodes in the moving average (CartPole-v0's "solved" window)
local FAILURE_KINDS = { proc_failed = true, unresponsive = true, timeout = true }

-- A ring of the last WINDOW returns.
local function new_window()
  return { n = 0, i = 0, sum = 0, vals = {} }
end
local function push_return(w, r)
  w.i = w.i % WINDOW + 1
  if w.n == WINDOW then w.sum = w.sum - w.vals[w.i] else w.n = w.n + 1 end
  w.vals[w.i] = r
  w.sum = w.sum + r
end
local function mean(w) return w.n > 0 and w.sum / w.n or 0 end

local function copy(t)
  local c = {}
  for i, v in ipairs(t) do c[i] = v end
  return c
end

--[[ Trains until the mean return of the last 100 episodes reaches `target`,
  or a limit is hit. opts:
    procs          ProcMesh to run the environments on (required; "cartpole" gets loaded)
    new_envs       function returning a list of ProcMeshes of procs to run environments on too,
                   polled once per update (hosts that joined; may return nil)
    envs           environments per actor (16)         seed     (1)
    per_call       episodes a rollout call waits for (4)
    lr, batch, max_staleness, gamma                    the learner's (rl.learner)
    target         mean return over 100 episodes that counts as solved (195)
    max_updates, max_seconds, max_episodes             limits (unbounded, 600, unbounded)
    stop_when      fn(stats) -> true to stop early (checked after every update)
    on_progress    fn(stats), called about every progress_every seconds (1)
    on_update      fn(stats), called after every update (faults can be injected here)
    on_episode     fn(e), called for every episode that arrives, e = { episode (1-based count),
                   ret, mean100 (mean return of the last 100 episodes, this one included),
                   rank (env proc), version (policy version that played it), seconds }
  Returns stats: solved, episodes, updates, version, seconds, env_steps, mean100,
  dropped, failures (list of errors of env procs), episodes_by_rank. ]]
function M.train(opts)
  local procs = assert(opts.procs, "train needs opts.procs")
  procs:load "cartpole"
  local actors = procs:spawn("env", "rl.cartpole_env", { envs = opts.envs or 16, seed = opts.seed or 1 },
    { deps = { "rl.policy" } })
  local learner = Learner.new { lr = opts.lr, batch = opts.batch, max_staleness = opts.max_staleness, gamma = opts.gamma }
  local target, per_call = opts.target or 195, opts.per_call or 4
  local max_seconds = opts.max_seconds or 600
  local t0 = monarch.now()
  local st = {
    solved = false, episodes = 0, updates = 0, version = 0, seconds = 0, env_steps = 0, mean100 = 0,
    dropped = 0, failures = {}, episodes_by_rank = {}, actors = actors, learner = learner,
  }
  local window = new_window()
  local last_steps = {}
  local finished = false
  local wake -- a Future the learner sleeps on while no batch is ready

  local function deliver(res)
    for _, ep in ipairs(res.episodes) do
      st.episodes = st.episodes + 1
      st.episodes_by_rank[res.rank] = (st.episodes_by_rank[res.rank] or 0) + 1
      push_return(window, ep.ret)
      if opts.on_episode then
        opts.on_episode { episode = st.episodes, ret = ep.ret, mean100 = mean(window), rank = res.rank,
          version = ep.version, seconds = monarch.now() - t0 }
      end
      learner:add(ep)
      if not st.solved and window.n == WINDOW and mean(window) >= target then
        st.solved, st.solved_episodes, st.solved_seconds = true, st.episodes, monarch.now() - t0
        st.solved_mean, st.solved_version = mean(window), learner.version
      end
    end
    -- Steps count per actor; a respawned actor starts again from zero.
    local d = res.steps - (last_steps[res.rank] or 0)
    st.env_steps = st.env_steps + (d >= 0 and d or res.steps)
    last_steps[res.rank] = res.steps
    if wake then wake:resolve(true) end
  end

  local function generate(one)
    while not finished do
      local fut = one:call_one("rollout", copy(learner.params), learner.version, per_call)
      local ok, res = pcall(fut.await, fut)
      if ok then
        deliver(res)
      elseif type(res) == "table" and FAILURE_KINDS[res.kind] then
        -- The rollout in flight is lost with its proc; what it had made is gone with it.
        st.failures[#st.failures + 1] = res
        local p = one:procs():procs()[1]
        if opts.on_env_failure then opts.on_env_failure(res, p) end
        if p.state == "dead" or p.state == "stopped" then
          if wake then wake:resolve(true) end -- the learner counts who is left
          return "lost"
        end
        -- restarting: the next call waits for the replacement and its actor.
      else
        error(res, 0) -- a bug in the actor or the learner: stop the run
      end
      if wake then wake:resolve(true) end
    end
    return "done"
  end

  -- One generator per env proc, over every host: a mesh from spawn_procs is hosts x procs.
  local gens = {}
  local function start_generators(am)
    local sizes = am:sizes()
    for h = 0, (sizes.hosts or 1) - 1 do
      for i = 0, (sizes.procs or am:size()) - 1 do
        local one = sizes.hosts and am:slice { hosts = h, procs = i } or am:slice { procs = i }
        gens[#gens + 1] = monarch.spawn(generate, one)
      end
    end
  end
  start_generators(actors)
  -- Env procs that arrive while it runs (hosts that joined): their actors and generators join in.
  local function take_new_envs()
    for _, m in ipairs(opts.new_envs and opts.new_envs() or {}) do
      m:load "cartpole"
      start_generators(m:spawn("env", "rl.cartpole_env", { envs = opts.envs or 16, seed = opts.seed or 1 },
        { deps = { "rl.policy" } }))
    end
  end

  local last_progress = t0
  local function stats()
    st.seconds = monarch.now() - t0
    st.version, st.mean100, st.dropped = learner.version, mean(window), learner.dropped
    st.steps_per_s = st.env_steps / math.max(st.seconds, 1e-9)
    st.mean_lag = learner:mean_lag()
    return st
  end

  while not finished do
    take_new_envs()
    while not learner:ready() and not finished do
      local alive = 0
      for _, g in ipairs(gens) do
        if g.state == "error" then g:get() end -- raises what went wrong in the generator
        if g.state == "pending" then alive = alive + 1 end
      end
      if alive == 0 then error("every environment proc has failed; no rollouts left", 0) end
      wake = monarch.future.new("episodes")
      wake:get()
      wake = nil
    end
    if learner:ready() and learner:update() > 0 then
      st.updates = st.updates + 1
      if opts.on_update then opts.on_update(stats()) end
    end
    local now = monarch.now()
    if opts.on_progress and now - last_progress >= (opts.progress_every or 1) then
      last_progress = now
      opts.on_progress(stats())
    end
    if st.solved or now - t0 > max_seconds or (opts.max_updates and st.updates >= opts.max_updates)
      or (opts.max_episodes and st.episodes >= opts.max_episodes) or (opts.stop_when and opts.stop_when(stats())) then
      finished = true
    end
  end
  -- Let the generators finish the rollouts they have in flight.
  for _, g in ipairs(gens) do
    local ok, err = pcall(g.get, g)
    if not ok then error(err, 0) end
  end
  return stats()
end

return M
