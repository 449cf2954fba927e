-- tests/support/toy_train.lua: a training script on monarch.train with a toy
-- step and no model, for train_lib_spec.lua. The state is w (f64, 8
-- values); step s adds s + 1 to every value, so after n steps from a fresh
-- start each value is its start plus n(n+1)/2, and a run that replays or
-- resumes a step wrongly ends with another sum. With --sharded the state
-- differs along "procs" (it starts at the proc's coordinate) and is
-- replicated along "hosts": one checkpoint shard per procs coordinate.
local monarch = require "monarch"
local train = require "monarch.train"

local N = 8
train.run {
  name = "toy",
  about = "A toy step for the training library's tests.",
  options = {
    { "sharded", false, "flag", "state differs along procs (replicated along hosts)" },
    { "step-sleep", 0, "number", "seconds each step sleeps on the procs (to give a test time)" },
  },
  libs = {},
  replicate = function(job) return job.opts.sharded and "hosts" or nil end,
  figures = { { "loss", "%.4f" } },
  plan = function() return { steps_per_epoch = 10 } end,
  setup = function(job)
    return { state = { w = job.procs:tensor("f64", { N }) }, work = { one = job.procs:tensor("f64", { N }) } }
  end,
  load = function(job) job.procs:call("fill", job.work.one, 1):get() end,
  init = function(job)
    if not job.opts.sharded then return job.procs:call("fill", job.state.w, 0):get() end
    local vals, per = {}, job.procs:size("procs")
    for i = 1, job:world() do
      local v = {}
      for k = 1, N do v[k] = (i - 1) % per end
      vals[i] = v
    end
    job.state.w:scatter(vals):get()
  end,
  step = function(job, s)
    if job.opts["step-sleep"] > 0 then job.procs:call("sleep", job.opts["step-sleep"]):get() end
    job.procs:call("axpy", s + 1, job.work.one, job.state.w):get()
    return { loss = 1 / (s + 1), samples = job:world() }
  end,
  evaluate = function(job)
    local sums = job.procs:call("sum", job.state.w):get():values()
    job.sums = sums
    return { { "sum", sums[1], "%.0f" } }
  end,
  finish = function(job, crcs)
    job:note("toy: %d procs, w sums %s, crc32 %08x", job:world(), table.concat(job.sums, ","), crcs.w)
  end,
}
