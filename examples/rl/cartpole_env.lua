--- A CartPole environment actor: one per proc, each owning a batch of
-- environments in a tensor of that proc, stepped by the C kernel
-- cartpole_step (kernels/cpu/cartpole.c) through proc.call.
--
--   procs:load "cartpole"
--   local envs = procs:spawn("env", "rl.cartpole_env", { envs = 16, seed = 1 }, { deps = { "rl.policy" } })
--   local r = envs:choose("rollout", params, version, 4):get()
--   -- r.episodes = { { obs = {...4 per step}, actions = {...}, ret = n, version = v }, ... }
--
-- The policy runs here, in the proc's LuaJIT, reading the observations
-- straight from tensor memory (state.data is a double*). Episodes that are
-- still running when a rollout returns carry on at the next rollout, with the
-- policy that call brings; an episode keeps the version it started with, the
-- oldest policy that acted in it, so the learner can bound staleness.
local policy = require "rl.policy"

local Env = {}
Env.__index = Env

local COLS = 5 -- x, x_dot, theta, theta_dot, steps (the kernel's layout)

-- A Park-Miller generator per actor: the proc's math.random is shared by
-- every actor of the proc, so reseeding it would disturb the others.
local function next_uniform(self)
  self.rng = (self.rng * 16807) % 2147483647
  return self.rng / 2147483647
end

--- new{ envs = N (16), seed = s (1), limit = episode steps (200: CartPole-v0) }
function Env.new(args, ctx)
  local n = args.envs or 16
  if type(n) ~= "number" or n < 1 or n ~= math.floor(n) then error("envs must be a positive integer", 2) end
  local self = setmetatable({
    n = n, limit = args.limit or 200, rank = ctx.rank,
    state = proc.new_tensor("f64", { n, COLS }),
    actions = proc.new_tensor("i32", { n }),
    done = proc.new_tensor("u8", { n }),
    seed = (args.seed or 1) * 1000003 + ctx.rank * 7919,
    steps = 0, episodes = 0,
    open = {}, -- env index -> the episode it is in: { obs = {}, actions = {}, version = v }
  }, Env)
  self.rng = self.seed % 2147483646 + 1
  proc.call("cartpole_reset", self.state, self.seed)
  return self
end

local function new_episode(version) return { obs = {}, actions = {}, version = version } end

--[[ Steps every env with `params` (policy version `version`) until at least
  min_episodes episodes have ended, at most max_steps batch steps (default
  10000). Returns { episodes = {...}, steps = env steps taken so far in all,
  rank = this proc's rank }. ]]
function Env:rollout(params, version, min_episodes, max_steps)
  local S, A, D = self.state.data, self.actions.data, self.done.data
  local n, open, out = self.n, self.open, {}
  max_steps = max_steps or 10000
  for i = 1, n do open[i] = open[i] or new_episode(version) end
  local taken = 0
  while #out < (min_episodes or 1) and taken < max_steps do
    for i = 0, n - 1 do
      local b = i * COLS
      local x, xd, th, thd = S[b], S[b + 1], S[b + 2], S[b + 3]
      local a = next_uniform(self) < policy.prob_right(params, x, xd, th, thd) and 1 or 0
      A[i] = a
      local ep = open[i + 1]
      local o, k = ep.obs, #ep.actions
      o[4 * k + 1], o[4 * k + 2], o[4 * k + 3], o[4 * k + 4] = x, xd, th, thd
      ep.actions[k + 1] = a
    end
    self.seed = self.seed + 1
    local ndone = proc.call("cartpole_step", self.state, self.actions, self.done, self.seed, self.limit)
    taken = taken + 1
    if ndone > 0 then
      for i = 0, n - 1 do
        if D[i] ~= 0 then
          local ep = open[i + 1]
          ep.ret = #ep.actions -- reward 1 per step
          ep.truncated = D[i] == 2
          out[#out + 1] = ep
          open[i + 1] = new_episode(version)
        end
      end
    end
  end
  self.steps = self.steps + taken * n
  self.episodes = self.episodes + #out
  return { episodes = out, steps = self.steps, rank = self.rank }
end

--- Steps every env `batch_steps` times with `params`, recording nothing (for
-- the benchmark). Returns env steps taken and episodes ended.
function Env:run(params, batch_steps)
  local S, A = self.state.data, self.actions.data
  local n, ended = self.n, 0
  for _ = 1, batch_steps do
    for i = 0, n - 1 do
      local b = i * COLS
      A[i] = next_uniform(self) < policy.prob_right(params, S[b], S[b + 1], S[b + 2], S[b + 3]) and 1 or 0
    end
    self.seed = self.seed + 1
    ended = ended + proc.call("cartpole_step", self.state, self.actions, self.done, self.seed, self.limit)
  end
  -- Episodes in progress were cut short by this run: start them again.
  proc.call("cartpole_reset", self.state, self.seed)
  self.open = {}
  return batch_steps * n, ended
end

--- Counters: env steps and episodes so far on this actor.
function Env:stats()
  return { steps = self.steps, episodes = self.episodes, envs = self.n, rank = self.rank }
end

return Env
