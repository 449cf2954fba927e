-- linreg.lua: linear regression on monarch.train, the library's smallest whole example (docs/training.md).
--   monarch-run examples/linreg.lua --steps 200
local train = require "monarch.train"
local N, D = 256, 4 -- rows per proc, features; the target is y = x . (1, 2, ..., D)

train.run {
  name = "linreg",
  options = { { "lr", 0.1, "number", "learning rate" } },
  figures = { { "loss", "%.2e" } },
  plan = function() return { steps_per_epoch = 50 } end,
  setup = function(job) local p = job.procs
    return { state = { w = p:tensor("f32", { D, 1 }) },
      data = { X = p:tensor("f32", { N, D }), y = p:tensor("f32", { N, 1 }) },
      work = { r = p:tensor("f32", { N, 1 }), g = p:tensor("f32", { D, 1 }) } }
  end,
  load = function(job) -- each proc its own rows, a function of the seed and its rank
    local xs, ys = {}, {}
    for r = 1, job:world() do
      local x, y = {}, {}
      for i = 1, N do
        local k = (r - 1) * N + i
        y[i] = 0
        for j = 1, D do x[(i - 1) * D + j] = math.sin(job.opts.seed + k * (j + 0.5)); y[i] = y[i] + j * x[(i - 1) * D + j] end
      end
      xs[r], ys[r] = x, y
    end
    job.data.X:scatter(xs):get(); job.data.y:scatter(ys):get()
  end,
  step = function(job) -- r = Xw - y; g = X'r / N, averaged over the procs; w -= lr g
    local p, w, x, k = job.procs, job.state.w, job.data, job.work
    p:call("sgemm", x.X, w, k.r); p:call("axpy", -1, x.y, k.r)
    p:call("sgemm", x.X, k.r, k.g, 1 / N, 0, true)
    p:all_reduce(k.g, "avg"); p:call("axpy", -job.opts.lr, k.g, w)
    local loss = 0
    for _, v in ipairs(p:call("dot", k.r, k.r):get():values()) do loss = loss + v / N / job:world() end
    return { loss = loss, samples = N * job:world() }
  end,
  finish = function(job) print("w = " .. table.concat(job.state.w:fetch():get()[1]:totable(), " ")) end,
}
