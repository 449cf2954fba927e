-- gpt.lua: a byte-level GPT (GPT-2's form) trained on a 2-D mesh of procs, data x tensor parallel (docs/gpt.md).
--   monarch-run examples/gpt.lua                         # the default: 4 layers x width 128 on dp 1 x tp 2, a sample
--   monarch-run examples/gpt.lua --dp 2 --tp 1 --sample 200 --plot gpt.svg
--
-- The model, its layers and the optimizer are C kernels (library "gpt",
-- kernels/cpu/gpt_*.c on OpenBLAS sgemm). The mesh is
-- hosts:spawn_procs{ {"dp", D}, {"tp", T} }: along tp the heads and the MLP's
-- hidden units are split (Megatron: all-reduces over mesh:group{dim = "tp"}
-- inside the block kernels); along dp each rank reads its own sequences of
-- every step and the whole flat gradient is summed in one all-reduce over
-- mesh:group{dim = {"hosts", "dp"}} (data parallel spans the hosts: --dp is
-- per host). One call per proc runs --fused steps.
--
-- Everything else is monarch.train's (docs/training.md): progress, snapshots
-- and recovery, checkpoints (one shard per tp rank), the check that the dp
-- replicas agree, the curves. Every random choice is a function of --seed and
-- the step, so a recovered run ends with the weights of an uninterrupted one.
local monarch = require "monarch"
local train = require "monarch.train"
local ffi = require "ffi"

pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")
ffi.C.setenv("OPENBLAS_NUM_THREADS", "1", 0) -- one BLAS thread per proc: the procs share the cores

local FORTUNES = "/usr/share/games/fortunes" -- Debian's fortunes package (scripts/deps.sh installs it)
local d = {} -- the text's and model's sizes, found by plan

-- The text files of dir (names without a dot: not the .dat indexes nor .u8 links), sorted: a fixed order.
local function text_files(job, dir)
  local p = io.popen("LC_ALL=C ls -1 '" .. dir:gsub("'", "'\\''") .. "' 2>/dev/null")
  local list = {}
  for name in p:lines() do
    if not name:find(".", 1, true) then list[#list + 1] = dir .. "/" .. name end
  end
  p:close()
  table.sort(list)
  if #list == 0 then job:die("no text files in " .. dir .. " (install the fortunes package: scripts/deps.sh)") end
  return list
end

local function check(o)
  for _, k in ipairs { "layers", "heads", "width", "context", "batch", "dp", "tp" } do
    if o[k] < 1 then return false, string.format("--%s must be at least 1, got %d", k, o[k]) end
  end
  if o.width % o.heads ~= 0 then
    return false, string.format("--width %d is not divisible by --heads %d", o.width, o.heads)
  end
  if o.heads % o.tp ~= 0 then
    return false, string.format("--heads %d is not divisible by --tp %d (each tp rank holds whole heads)", o.heads, o.tp)
  end
  if not (o.lr > 0) then return false, "--lr must be positive" end
  return true
end

local function plan(job)
  local o = job.opts
  d.paths = table.concat(text_files(job, o.data), "\n")
  d.bytes = job:first():call_one("gpt_text_size", d.paths):get()
  d.ntrain = math.floor(d.bytes * 0.9)
  d.numel = job:first():call_one("gpt_info", o.layers, o.heads, o.width, o.context, o.tp):get()
  d.full = job:first():call_one("gpt_info", o.layers, o.heads, o.width, o.context, 1):get()
  return { steps_per_epoch = o["eval-every"] }
end

local function setup(job)
  local p = job.procs
  return {
    state = { params = p:tensor("f32", { d.numel }), adam = p:tensor("f32", { 2 * d.numel }) }, -- P; m | v
    work = { G = p:tensor("f32", { d.numel + 1 }) }, -- the gradient and, last, the step's summed loss
    data = { D = p:tensor("u8", { d.bytes }) },
  }
end

-- Data parallel runs over the hosts and each host's dp ranks: the procs that share a tp coordinate.
local DP = { "hosts", "dp" }

-- The kernel groups along tp and DP, made again whenever the procs change.
local groups = {}
local function group(job, dim)
  local key = type(dim) == "table" and table.concat(dim, ",") or dim
  local g = groups[key]
  if not g or g.gen ~= job.generation or g.g._dead then
    g = { g = job.procs:group { dim = dim }, gen = job.generation }
    groups[key] = g
  end
  return g.g
end

-- The data-parallel ranks now (hosts x dp; fewer after a lost host, more after a join).
local function dp_ranks(job) return math.floor(job:world() / job.opts.tp) end

local function load(job) job.procs:call("gpt_text_load", d.paths, job.data.D):get() end

local function init(job)
  local o = job.opts
  job.procs:call("gpt_init", group(job, "tp"), job.state.params, o.layers, o.heads, o.width, o.context, o.seed):get()
  if o["dump-init"] then -- the initial weights for bench/gpt_torch.py (one file: tp = 1)
    if o.tp ~= 1 then job:die("--dump-init wants --tp 1 (one file of the whole model)") end
    local bytes = job:first():call_one("gpt_bytes", job.state.params):get()
    local f = assert(io.open(o["dump-init"], "wb"))
    f:write(bytes)
    f:close()
    job:note("initial weights: %s (%d floats)", o["dump-init"], d.numel)
  end
end

local function sample(job, n)
  local o = job.opts
  local r = job.procs:call("gpt_sample", group(job, "tp"), job.state.params, o.layers, o.heads, o.width, o.context,
    o.prompt, n, o.seed, o.temperature):get()
  return r[1]
end

local done_steps = 0
local function step(job, s, limit)
  local o, st = job.opts, job.state
  local n = math.min(o.fused, limit)
  local r = job.procs:call("gpt_train", group(job, "tp"), group(job, DP), st.params, job.work.G, st.adam,
    job.data.D, d.ntrain, o.layers, o.heads, o.width, o.context, o.batch, o.seed, s, n, o.lr, o.warmup, job.total,
    o.wd, o.clip):get()
  local list, tokens = {}, o.batch * o.context * dp_ranks(job)
  for i = 0, n - 1 do list[i + 1] = { loss = r[1][2 * i + 1], norm = r[1][2 * i + 2], samples = tokens } end
  done_steps = s + n
  return list
end

local last_sample = 0
-- Validation loss on fixed windows: each dp rank runs its part, the kernel sums the parts over dp.
local function evaluate(job)
  local o = job.opts
  local r = job.procs:call("gpt_eval", group(job, "tp"), group(job, DP), job.state.params, job.data.D, d.ntrain,
    o.layers, o.heads, o.width, o.context, o.batch, o["eval-windows"]):get()[1]
  local loss, tokens = r[1], r[2]
  d.val = loss / tokens
  if o["sample-every"] and done_steps - last_sample >= o["sample-every"] then
    last_sample = done_steps
    job:note("sample at step %d: %q", done_steps, o.prompt .. sample(job, o.sample > 0 and o.sample or 120))
  end
  return { { "val loss", d.val, "%.4f" }, { "bigram", d.bigram, "%.4f" } }
end

train.run {
  name = "gpt",
  about = "Trains a byte-level GPT on the fortunes text on a dp x tp mesh (docs/gpt.md).",
  options = {
    { "layers", 4, "int", "transformer blocks" },
    { "heads", 4, "int", "attention heads (split over tp)" },
    { "width", 128, "int", "embedding width (divisible by heads)" },
    { "context", 64, "int", "bytes per sequence" },
    { "batch", 16, "int", "sequences per dp rank per step" },
    { "dp", 1, "int", "data-parallel ranks per host (data parallel spans the hosts too)" },
    { "tp", 2, "int", "tensor-parallel ranks (divide heads)" },
    { "steps", 800, "int", "training steps" },
    { "lr", 3e-3, "number", "peak AdamW learning rate" },
    { "warmup", 50, "int", "steps of linear warmup (then cosine to lr/10)" },
    { "wd", 0.1, "number", "AdamW weight decay (matrices only)" },
    { "clip", 1.0, "number", "gradient clipping by global norm (0: none)" },
    { "fused", 10, "int", "steps per kernel call", min = 1 },
    { "eval-every", 100, "int", "steps between validation losses", min = 1 },
    { "eval-windows", 64, "int", "validation windows of --context bytes", min = 1 },
    { "sample", 200, "int", "bytes to generate at the end (0: none)", min = 0 },
    { "sample-every", nil, "int", "also generate a sample every K steps (at a validation)", min = 1 },
    { "prompt", "The ", "string", "the samples' prompt" },
    { "temperature", 0.8, "number", "sampling temperature (0: the most likely byte)" },
    { "data", FORTUNES, "string", "directory of text files (concatenated in name order)" },
    { "dump-init", nil, "string", "write the initial weights (f32, tp = 1) to this file" },
  },
  check = check,
  spawn = function(job) return monarch.hosts():spawn_procs { { "dp", job.opts.dp }, { "tp", job.opts.tp } } end,
  libs = { "gpt" },
  replicate = DP,
  figures = { { "loss", "%.4f", label = "training loss (nats/byte)", min = 0 },
    { "norm", "%.3f", curve = "grad norm", axis = "y2", label = "gradient norm" } },
  plan = plan, setup = setup, load = load, init = init, step = step, evaluate = evaluate,
  started = function(job)
    local o = job.opts
    local r = job:first():call_one("gpt_bigram", job.data.D, d.ntrain):get() -- once: the baseline to beat
    d.bigram = r[1]
    job:say("text: %d bytes of %s (%d train, %d validation); bigram baseline val loss %.4f (alpha %g)", d.bytes, o.data,
      d.ntrain, d.bytes - d.ntrain, d.bigram, r[2])
    job:say("model: %d layers, %d heads, width %d, context %d: %d parameters (%d per tp rank)", o.layers, o.heads,
      o.width, o.context, d.full, d.numel)
    job:say("mesh: %d host(s) x dp %d x tp %d (data parallel over %d ranks, %d sequences per step); memory per proc " ..
      "(params, grads, AdamW) %.1f MB", job:nhosts(), o.dp, o.tp, dp_ranks(job), dp_ranks(job) * o.batch, 16 * d.numel / 1e6)
  end,
  on_world = function(job, before, after)
    local tp = job.opts.tp
    return string.format("data parallel over %d -> %d ranks: %d -> %d sequences per step, learning rate unchanged",
      before / tp, after / tp, job.opts.batch * before / tp, job.opts.batch * after / tp)
  end,
  title = function(job)
    local o = job.opts
    return string.format("gpt.lua: %d layers x width %d, dp %d x tp %d; val loss %.3f (bigram %.3f)", o.layers,
      o.width, dp_ranks(job), o.tp, d.val or 0, d.bigram or 0)
  end,
  finish = function(job, crcs)
    local o = job.opts
    local gap = 100 * (1 - d.val / d.bigram)
    job:note("val loss %.4f, bigram baseline %.4f (%.1f%% %s)", d.val, d.bigram, math.abs(gap), gap >= 0 and "below" or
      "above: train longer")
    if o.sample > 0 then job:note("sample: %s%s", o.prompt, sample(job, o.sample)) end
    -- Every proc's state (its tp shard of the weights and AdamW state): the fingerprint a recovered run must match.
    local r, list = job.procs:call("shard_crc", job.state.params, job.state.adam):get(), {}
    for i = 1, r:size() do list[i] = string.format("%08x", type(r[i]) == "table" and r[i][1] or r[i]) end
    job:note("state crc32 per proc: %s", table.concat(list, " "))
  end,
}
