--- REINFORCE with a baseline for the linear softmax policy of rl.policy,
-- run on the controller. Episodes arrive from the environment actors tagged
-- with the policy version that started them; the learner keeps at most
-- max_staleness versions of lag and drops older episodes.
--
--   local L = Learner.new{ lr = 0.1, batch = 16, max_staleness = 3 }
--   L:add(episode)                       -- { obs, actions, ret, version }
--   if L:ready() then L:update() end     -- one Adam step; L.version + 1
local policy = require "rl.policy"

local Learner = {}
Learner.__index = Learner

local sqrt = math.sqrt

--- new{ lr (0.1), gamma (0.99), batch (16 episodes per update), max_staleness (3 versions) }
function Learner.new(opts)
  opts = opts or {}
  local n = policy.NPARAMS
  local self = setmetatable({
    params = policy.zeros(), version = 0,
    lr = opts.lr or 0.1, gamma = opts.gamma or 0.99, batch = opts.batch or 16,
    max_staleness = opts.max_staleness or 3,
    m = {}, v = {}, t = 0, -- Adam moments
    buffer = {}, used = 0, dropped = 0, lag_sum = 0,
  }, Learner)
  for i = 1, n do self.m[i], self.v[i] = 0, 0 end
  return self
end

local function stale(self, ep) return self.version - ep.version > self.max_staleness end

--- Queues an episode for the next update; drops it (returns false) if its
-- policy is more than max_staleness versions old.
function Learner:add(ep)
  if stale(self, ep) then
    self.dropped = self.dropped + 1
    return false
  end
  self.buffer[#self.buffer + 1] = ep
  return true
end

--- True when a batch of episodes is queued.
function Learner:ready() return #self.buffer >= self.batch end

-- Discounted returns-to-go of every step of the batch, and their mean and spread.
local function returns_to_go(batch, gamma)
  local all, sum, n = {}, 0, 0
  for b, ep in ipairs(batch) do
    local T, g, gs = #ep.actions, 0, {}
    for t = T, 1, -1 do
      g = 1 + gamma * g
      gs[t] = g
      sum, n = sum + g, n + 1
    end
    all[b] = gs
  end
  local mean = sum / n
  local var = 0
  for _, gs in ipairs(all) do
    for _, g in ipairs(gs) do var = var + (g - mean) ^ 2 end
  end
  return all, mean, sqrt(var / n) + 1e-8, n
end

--- One policy-gradient step on the queued batch: the baseline is the batch's
-- mean return-to-go (advantages scaled by its spread), the step is Adam's.
-- Returns the number of episodes used (0 if all had gone stale).
function Learner:update()
  local batch = {}
  for _, ep in ipairs(self.buffer) do
    if stale(self, ep) then self.dropped = self.dropped + 1 else batch[#batch + 1] = ep end
  end
  self.buffer = {}
  if #batch == 0 then return 0 end
  local gs, mean, sd, nsteps = returns_to_go(batch, self.gamma)
  local p, g = self.params, {}
  for i = 1, policy.NPARAMS do g[i] = 0 end
  for b, ep in ipairs(batch) do
    local o, acts, ret = ep.obs, ep.actions, gs[b]
    for t = 1, #acts do
      local k = 4 * (t - 1)
      policy.add_grad_logp(p, g, o[k + 1], o[k + 2], o[k + 3], o[k + 4], acts[t], (ret[t] - mean) / sd)
    end
    self.lag_sum = self.lag_sum + (self.version - ep.version)
  end
  self.t = self.t + 1
  local b1, b2 = 0.9, 0.999
  for i = 1, policy.NPARAMS do
    local gi = g[i] / nsteps
    self.m[i] = b1 * self.m[i] + (1 - b1) * gi
    self.v[i] = b2 * self.v[i] + (1 - b2) * gi * gi
    local mh, vh = self.m[i] / (1 - b1 ^ self.t), self.v[i] / (1 - b2 ^ self.t)
    p[i] = p[i] + self.lr * mh / (sqrt(vh) + 1e-8) -- ascent: maximise the return
  end
  self.version = self.version + 1
  self.used = self.used + #batch
  return #batch
end

--- Mean policy lag (versions) of the episodes used so far.
function Learner:mean_lag() return self.used > 0 and self.lag_sum / self.used or 0 end

return Learner
