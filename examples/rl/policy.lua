--- A linear softmax policy for CartPole, shared by the learner (on the
-- controller) and the environment actors (shipped to the procs with
-- spawn's deps = {"rl.policy"}).
--
-- Two actions, so the softmax over their logits reduces to a logistic of the
-- logit difference: p(right | s) = sigmoid(w . s + b), with params
-- { w1, w2, w3, w4, b }. log p(a | s) has gradient (a - p) * {s, 1}.
local M = {}

M.NPARAMS = 5 -- four weights and a bias

local exp = math.exp

--- A zero policy (both actions equally likely).
function M.zeros()
  return { 0, 0, 0, 0, 0 }
end

--- p(push right | observation).
function M.prob_right(params, x, x_dot, theta, theta_dot)
  local z = params[1] * x + params[2] * x_dot + params[3] * theta + params[4] * theta_dot + params[5]
  return 1 / (1 + exp(-z))
end

--- Adds scale * grad log p(a | s) to g (an array of NPARAMS numbers).
function M.add_grad_logp(params, g, x, x_dot, theta, theta_dot, a, scale)
  local d = (a - M.prob_right(params, x, x_dot, theta, theta_dot)) * scale
  g[1] = g[1] + d * x
  g[2] = g[2] + d * x_dot
  g[3] = g[3] + d * theta
  g[4] = g[4] + d * theta_dot
  g[5] = g[5] + d
end

return M
