-- train.lua: data-parallel training of a small neural network (one ReLU
-- hidden layer) that classifies the UCI handwritten digits (8x8 images).
--   monarch-run examples/train.lua                 # 4 procs, prints progress and a summary
--   monarch-run examples/train.lua --help          # options
--   monarch-run examples/train.lua --device gpu    # on the GPUs (one proc per GPU)
--
-- Each proc holds its own shard of the training rows and the same test
-- rows (kernels digits_load, in kernels/cpu/mlp.c). Every step, each proc
-- computes the gradient of its own batch (mlp_forward_backward), the
-- gradients are summed across procs (ProcMesh:all_reduce), and every proc
-- applies the same Adam update (mlp_adam), so the weights stay identical
-- everywhere. On GPUs the model kernels are cuda_mlp's (same names, which
-- shadow mlp's) and the all-reduce is NCCL's.
--
-- Everything else is monarch.train's (docs/training.md): options, progress,
-- snapshots and recovery from a killed proc, a lost host or a joining one,
-- checkpoints, the check that every proc ends with the same weights, the
-- curves, and taking the job over after the controller dies. Everything
-- random is a function of --seed and the step, so a run that recovers or
-- resumes ends with the same weights as one that was never interrupted.
local monarch = require "monarch"
local train = require "monarch.train"
local gpu = require "monarch.gpu"
local ffi = require "ffi"

local errors = monarch.errors
pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")

-- One BLAS thread per proc: several procs share this machine's cores. The
-- local host agent passes our environment on to the procs.
ffi.C.setenv("OPENBLAS_NUM_THREADS", "1", 0)

local script = arg and arg[0] or "examples/train.lua"
local repo = (script:match("^(.*)/[^/]*$") or ".") .. "/.."

local function exists(p)
  local f = io.open(p, "rb")
  if f then f:close() end
  return f ~= nil
end

-- The data file: --data, or data/digits.csv.gz (fetched when missing).
local function data_file(job)
  local data = job.opts.data
  if data then return exists(data) and require("monarch.train_ckpt").absolute(data) or job:die("data file " .. data ..
    " does not exist") end
  data = require("monarch.train_ckpt").absolute(repo) .. "/data/digits.csv.gz"
  if not exists(data) then
    local fetch = repo .. "/scripts/fetch-digits.sh"
    job:note("data: %s is missing; fetching it with %s", data, fetch)
    local ok = os.execute(string.format("'%s' '%s'", fetch:gsub("'", "'\\''"), data:gsub("'", "'\\''")))
    if (ok ~= 0 and ok ~= true) or not exists(data) then
      job:die("could not fetch the digits data set (see the message above); or pass --data FILE")
    end
  end
  return data
end

local on_gpu, device_line = false, "device: cpu (mlp, OpenBLAS)"
local d = {} -- the data set's sizes (digits_info), the data file, the model's size

-- The procs: on the CPUs, or (--device gpu, or auto with a GPU and cuda_mlp) one per GPU.
local function spawn(job)
  local procs = monarch.hosts():spawn_procs{ procs = job.opts.procs }
  if job.opts.device == "cpu" then return procs end
  local info, why = gpu.info(procs)
  if info then
    local ok, err = pcall(procs.load, procs, "cuda_mlp")
    if ok then
      on_gpu = true
      device_line = string.format("device: gpu, %d x %s per host (cuda_mlp, cuBLAS; gradients all-reduced by NCCL)",
        info.count, info.name)
      procs:stop()
      return monarch.hosts():spawn_procs{ procs = info.count, gpus = info.count }
    end
    why = "cuda_mlp does not load: " .. tostring(errors.is(err) and err.message or err)
  end
  if job.opts.device == "gpu" then job:die("--device gpu: " .. tostring(why)) end
  device_line = device_line .. "; no GPU used: " .. tostring(why)
  return procs
end

local function plan(job)
  local o = job.opts
  d.file = data_file(job)
  local info = job:first():call_one("digits_info", d.file, o["test-fraction"]):get()
  d.rows, d.features, d.classes, d.n_train, d.n_test, d.shard = unpack(info)
  d.nparams = d.features * o.hidden + o.hidden + o.hidden * d.classes + d.classes
  local spe = math.floor(d.shard / o.batch)
  if spe < 1 then job:die(string.format("each of %d procs holds %d training rows, fewer than --batch %d",
    job:world(), d.shard, o.batch)) end
  if d.n_test < 1 then job:die(string.format("--test-fraction %g of %d rows holds out no rows to test on",
    o["test-fraction"], d.rows)) end
  return { steps_per_epoch = spe }
end

local function setup(job)
  local p = job.procs
  local function new(dtype, shape) return on_gpu and p:gpu_tensor(dtype, shape) or p:tensor(dtype, shape) end
  return {
    state = { params = new("f32", { d.nparams }), adam = new("f32", { 2 * d.nparams }) }, -- W1|b1|W2|b2; m|v
    work = { G = new("f32", { d.nparams }) },
    data = { X = new("f32", { d.shard, d.features }), Y = new("i32", { d.shard }),
      Xt = new("f32", { d.n_test, d.features }), Yt = new("i32", { d.n_test }) },
  }
end

-- Each proc reads its own shard and the test rows (on GPUs into CPU tensors first, then copies them over).
local function load(job)
  local p, x = job.procs, job.data
  local cpu = on_gpu and {} or x
  if on_gpu then for k, t in pairs(x) do cpu[k] = p:tensor(t.dtype, t.shape) end end
  p:call("digits_load", d.file, job.opts["test-fraction"], job.opts.seed, cpu.X, cpu.Y, cpu.Xt, cpu.Yt):get()
  if on_gpu then for k, t in pairs(cpu) do p:call("mlp_copy", t, x[k]):get(); t:free() end end
end

local function init(job)
  job.procs:call("mlp_init", job.state.params, d.features, job.opts.hidden, d.classes, job.opts.seed):get()
end

-- The figures of a step from the procs' summed loss and number correct.
local function figures(loss, correct, n) return { loss = loss / n, acc = correct / n, samples = n } end

-- Step s (0-based): gradients on every proc, all-reduce, Adam.
local function step(job, s)
  local o, st, x = job.opts, job.state, job.data
  local spe = job.epoch_steps
  local fb = job.procs:call("mlp_forward_backward", st.params, x.X, x.Y, job.work.G, o.hidden, d.classes, o.batch,
    o.seed, math.floor(s / spe), s % spe)
  job.procs:all_reduce(job.work.G, "sum"):get()
  local upd = job.procs:call("mlp_adam", st.params, job.work.G, st.adam, o.lr, s + 1, 1 / job:world())
  local r = fb:get()
  upd:get()
  local loss, correct = 0, 0
  for i = 1, r:size() do loss, correct = loss + r[i][1], correct + r[i][2] end
  return figures(loss, correct, o.batch * job:world())
end

-- --fused K: steps s .. s+n-1 in one call per proc (mlp_train: gradient, in-kernel all_reduce and Adam each step,
-- the same arithmetic in the same order as step, so the weights come out bitwise the same).
local kgroup, kgen
local function fused(job, s, limit)
  local o, st, x = job.opts, job.state, job.data
  if kgen ~= job.generation or kgroup._dead then kgroup, kgen = job.procs:group(), job.generation end
  local n = math.min(o.fused, limit)
  local r = job.procs:call("mlp_train", kgroup, st.params, x.X, x.Y, job.work.G, o.hidden, d.classes, o.batch, st.adam,
    o.seed, o.lr, s, n, job.epoch_steps):get()
  local list = {}
  for i = 0, n - 1 do
    local loss, correct = 0, 0
    for p = 1, r:size() do loss, correct = loss + r[p][2 * i + 1], correct + r[p][2 * i + 2] end
    list[i + 1] = figures(loss, correct, o.batch * job:world())
  end
  return list
end

local function evaluate(job)
  local r = job:first():call_one("mlp_evaluate", job.state.params, job.data.Xt, job.data.Yt, job.opts.hidden,
    d.classes):get()
  d.test = { loss = r[1] / r[3], acc = r[2] / r[3], correct = r[2], n = r[3] }
  return { { "test loss", d.test.loss, "%.4f" }, { "test acc", 100 * d.test.acc, "%5.1f%%" } }
end

train.run {
  name = "train",
  about = "Trains a one-hidden-layer network on the UCI digits, data-parallel (docs/training.md).",
  options = {
    { "procs", 4, "int", "procs to train on (on each host; on GPUs one per GPU instead)" },
    { "device", "auto", "string", "cpu, gpu, or auto (a GPU when there is one and cuda_mlp loads)" },
    { "batch", 32, "int", "samples per proc per step (the global batch is batch x procs)", min = 1 },
    { "lr", 0.003, "number", "Adam learning rate" },
    { "hidden", 128, "int", "hidden units", min = 1 },
    { "test-fraction", 0.2, "number", "share of the rows held out for testing" },
    { "data", nil, "string", "data file (default: data/digits.csv.gz, fetched if missing)" },
    { "fused", nil, "int", "run K steps per call (mlp_train: in-kernel all_reduce; CPU only)", min = 1 },
  },
  check = function(o)
    if not (o.lr > 0) then return false, "--lr must be positive" end
    if o.device ~= "auto" and o.device ~= "cpu" and o.device ~= "gpu" then
      return false, "--device must be auto, cpu or gpu, got '" .. o.device .. "'"
    end
    if not (o["test-fraction"] > 0 and o["test-fraction"] < 1) then return false, "--test-fraction must be between 0 and 1" end
    return true
  end,
  spawn = spawn,
  libs = function() return on_gpu and { "mlp", "cuda_mlp" } or { "mlp" } end,
  bytes_kernel = "mlp_bytes",
  figures = { { "loss", "%.4f", label = "loss (the step's batch)", min = 0 },
    { "acc", "%5.1f%%", scale = 100, curve = "accuracy", axis = "y2", label = "accuracy % (the step's batch)",
      min = 0, max = 100 } },
  plan = plan, setup = setup, load = load, init = init, evaluate = evaluate,
  step = function(job, s, limit)
    if job.opts.fused and not on_gpu and (limit > 1 or job.opts["kill-at"] ~= s) then return fused(job, s, limit) end
    return step(job, s)
  end,
  started = function(job)
    local o = job.opts
    job:say("digits: %d rows of %d features, %d classes; %d for training (%d per proc), %d held out", d.rows,
      d.features, d.classes, d.n_train, d.shard, d.n_test)
    job:say("model: %d -> %d (ReLU) -> %d, %d parameters; Adam lr %g", d.features, o.hidden, d.classes, d.nparams, o.lr)
    job:say("%s%s", device_line, o.fused and not on_gpu and string.format("; %d steps per call (mlp_train)", o.fused) or "")
    job:say("training on %d procs: batch %d per proc (%d global), %d steps per epoch, %d steps", job:world(), o.batch,
      o.batch * job:world(), job.epoch_steps, job.total)
  end,
  on_world = function(job, before, after)
    return string.format("global batch %d -> %d, gradients averaged over %d procs", job.opts.batch * before,
      job.opts.batch * after, after)
  end,
  title = function(job)
    return string.format("train.lua: digits, %d procs x batch %d, lr %g; test accuracy %.1f%%", job:world(),
      job.opts.batch, job.opts.lr, 100 * d.test.acc)
  end,
  finish = function(job, crcs)
    job:note("test accuracy %.2f%% (%d/%d), test loss %.4f", 100 * d.test.acc, d.test.correct, d.test.n, d.test.loss)
    job:note("weights identical on all %d procs (%d parameters, crc32 %08x)", job:world(), d.nparams, crcs.params)
  end,
}
