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
-- everywhere; the end of the run checks that, byte for byte.
--
-- With --device gpu (or auto, the default, on a host with a GPU and the
-- cuda_mlp library) the same loop runs on GPU tensors: one proc per GPU, the
-- model kernels of kernels/cuda/cuda_mlp.cu (same names as mlp's, which they
-- shadow), and the same ProcMesh:all_reduce call, which hands GPU tensors to
-- NCCL. The data is still read by mlp's digits_load into CPU tensors on each
-- proc and copied to its GPU there (mlp_copy).
--
-- Everything random is a function of --seed and the step, so a run is
-- reproducible bit for bit: a run resumed from a checkpoint, or one that
-- recovers from a failed proc, ends with the same weights as a run that was
-- never interrupted.
--
-- A host lost for good (its agent gone, with its procs) does not end the
-- run: training goes on data-parallel on the surviving hosts from the step
-- that failed. Each proc keeps a copy of its weights and Adam state from
-- before the step; the survivors put those back, drop the lost shards, and
-- average the gradients over the procs that are left (docs/training.md).
-- A host that joins (monarch-worker --join, with monarch-run --listen-joins)
-- gets procs at the next step; they receive the weights, the Adam state and
-- a data shard from a healthy peer, proc to proc, and train from then on.
local monarch = require "monarch"
local checkpoint = require "monarch.checkpoint"
local plot = require "monarch.plot"
local gpu = require "monarch.gpu"
local ffi = require "ffi"

local errors = monarch.errors

for _, d in ipairs {
  "int isatty(int fd);",
  "int setenv(const char *name, const char *value, int overwrite);",
  "char *realpath(const char *path, char *resolved);",
  "void free(void *p);",
} do pcall(ffi.cdef, d) end

-- ---- options ------------------------------------------------------------------------------

local SNAPSHOT_EVERY = 10     -- default steps between in-memory copies of the weights (for recovery)
local READY_TIMEOUT = 60      -- seconds to wait for restarted procs
local MAX_RECOVERIES = 5      -- failed steps tolerated in one run before giving up
local REDRAW_INTERVAL = 0.1   -- seconds between progress bar redraws on a terminal
local BAR_WIDTH = 24          -- characters in the progress bar

local OPTIONS = { -- name, default, kind, help
  { "procs", 4, "int", "procs to train on (on each host; on GPUs one per GPU instead)" },
  { "device", "auto", "string", "cpu, gpu, or auto (a GPU when there is one and cuda_mlp loads)" },
  { "epochs", 20, "int", "passes over the training data" },
  { "steps", nil, "int", "total steps instead of --epochs (for short runs)" },
  { "batch", 32, "int", "samples per proc per step (the global batch is batch x procs)" },
  { "lr", 0.003, "number", "Adam learning rate" },
  { "hidden", 128, "int", "hidden units" },
  { "seed", 1, "int", "seed of the split, the initial weights and the batch order" },
  { "test-fraction", 0.2, "number", "share of the rows held out for testing" },
  { "data", nil, "string", "data file (default: data/digits.csv.gz, fetched if missing)" },
  { "checkpoint-dir", "checkpoints", "string", "directory for checkpoints" },
  { "every", 100, "int", "steps between checkpoints (0: no checkpoints)" },
  { "keep", 3, "int", "checkpoints kept" },
  { "resume", false, "flag", "continue from the newest valid checkpoint in --checkpoint-dir" },
  { "resume-from", nil, "string", "continue from this checkpoint file" },
  { "snapshot-every", SNAPSHOT_EVERY, "int", "steps between in-memory copies of the weights, for recovery" },
  { "log-every", 20, "int", "steps between progress lines when stdout is not a terminal" },
  { "quiet", false, "flag", "print only the summary" },
  { "plot", nil, "string", "SVG file for a line plot of the loss and accuracy of every step" },
  { "csv", nil, "string", "CSV file for the loss and accuracy of every step" },
  { "fused", nil, "int", "run K steps per call (mlp_train: in-kernel all_reduce; CPU only)" },
  { "fail-at", nil, "int", "testing: fail step N once (simulated) to exercise recovery" },
  { "kill-at", nil, "int", "testing: kill the last proc at step N (needs restart support)" },
  { "kill-host-at", nil, "int", "testing: kill the last host's agent (and so its procs) at step N" },
  { "wait-join-at", nil, "int", "testing: at step N, wait (up to 60 s) until a host has joined (monarch-run --listen-joins)" },
  { "help", false, "flag", "show this help" },
}

-- A mistake in how the script was run: the message alone, without a traceback; exit status 1 as for any failed script.
local function die(msg)
  io.stderr:write("train.lua: ", msg, "\n")
  if package.loaded.monarch then monarch.shutdown() end
  os.exit(1)
end

local function usage()
  local lines = { "usage: monarch-run examples/train.lua [options]", "" }
  for _, o in ipairs(OPTIONS) do
    local name = "--" .. o[1] .. (o[3] == "flag" and "" or " " .. o[3]:upper())
    local def = (o[2] ~= nil and o[3] ~= "flag") and string.format(" (default %s)", tostring(o[2])) or ""
    lines[#lines + 1] = string.format("  %-26s %s%s", name, o[4], def)
  end
  return table.concat(lines, "\n")
end

local function parse_args(argv)
  local opts, spec = {}, {}
  for _, o in ipairs(OPTIONS) do
    opts[o[1]] = o[2]
    spec[o[1]] = o
  end
  local i = 1
  while argv[i] do
    local a = argv[i]
    local name, inline = a:match("^%-%-([%w%-]+)=(.*)$")
    name = name or a:match("^%-%-([%w%-]+)$")
    local o = name and spec[name]
    if not o then die("unknown argument '" .. a .. "'\n" .. usage()) end
    if o[3] == "flag" then
      if inline then die("--" .. name .. " takes no value") end
      opts[name] = true
    else
      local v = inline or argv[i + 1]
      if v == nil then die("--" .. name .. " needs a value") end
      if not inline then i = i + 1 end
      if o[3] ~= "string" then
        local n = tonumber(v)
        if not n or (o[3] == "int" and n ~= math.floor(n)) then
          error(string.format("train.lua: --%s wants %s, got '%s'", name, o[3] == "int" and "an integer" or "a number", v), 0)
        end
        v = n
      end
      opts[name] = v
    end
    i = i + 1
  end
  local function at_least(name, lo)
    if opts[name] ~= nil and opts[name] < lo then error(string.format("train.lua: --%s must be at least %d", name, lo), 0) end
  end
  at_least("procs", 1); at_least("epochs", 1); at_least("steps", 1); at_least("batch", 1); at_least("hidden", 1)
  at_least("fused", 1); at_least("every", 0); at_least("keep", 1); at_least("snapshot-every", 1); at_least("log-every", 1)
  if not (opts.lr > 0) then die("--lr must be positive") end
  if opts.device ~= "auto" and opts.device ~= "cpu" and opts.device ~= "gpu" then
    die("--device must be auto, cpu or gpu, got '" .. opts.device .. "'")
  end
  if not (opts["test-fraction"] > 0 and opts["test-fraction"] < 1) then die("--test-fraction must be between 0 and 1") end
  -- A bad output path stops the run now, not after the training.
  for _, name in ipairs { "plot", "csv" } do
    if opts[name] then
      local ok, err = plot.writable(opts[name])
      if not ok then die("--" .. name .. ": " .. err) end
    end
  end
  return opts
end

local opts = parse_args(arg or {})
if opts.help then
  print(usage())
  return
end

-- ---- output ------------------------------------------------------------------------------

local tty = ffi.C.isatty(1) == 1
local function say(fmt, ...)
  if not opts.quiet then io.stdout:write(string.format(fmt, ...), "\n") end
end
local bar_shown = false
local function clear_bar()
  if bar_shown then
    io.stdout:write("\r\027[K")
    bar_shown = false
  end
end
local function note(fmt, ...) -- a line that is printed even with --quiet
  clear_bar()
  io.stdout:write(string.format(fmt, ...), "\n")
  io.stdout:flush()
end

-- ---- paths and data --------------------------------------------------------------------

local function realpath(p)
  local r = ffi.C.realpath(p, nil)
  if r == nil then return nil end
  local s = ffi.string(r)
  ffi.C.free(r)
  return s
end

local function file_exists(p)
  local f = io.open(p, "rb")
  if f then f:close() end
  return f ~= nil
end

local script = arg and arg[0] or "examples/train.lua"
local repo = realpath((script:match("^(.*)/[^/]*$") or ".") .. "/..") or "."

local function ensure_data()
  local data = opts.data
  if data then return realpath(data) or die("data file " .. data .. " does not exist") end
  data = repo .. "/data/digits.csv.gz"
  if not file_exists(data) then
    local fetch = repo .. "/scripts/fetch-digits.sh"
    note("data: %s is missing; fetching it with %s", data, fetch)
    local ok = os.execute(string.format("'%s' '%s'", fetch:gsub("'", "'\\''"), data:gsub("'", "'\\''")))
    if (ok ~= 0 and ok ~= true) or not file_exists(data) then
      die("could not fetch the digits data set (see the message above); or pass --data FILE")
    end
  end
  return data
end

local data = ensure_data()

-- One BLAS thread per proc: several procs share this machine's cores. The
-- local host agent passes our environment on to the procs.
ffi.C.setenv("OPENBLAS_NUM_THREADS", "1", 0)

-- ---- the mesh and its state -------------------------------------------------------------

local procs = monarch.hosts():spawn_procs{ procs = opts.procs }

-- The device: a GPU when asked for, or (auto) when the procs see one and
-- can load cuda_mlp; then the CPU procs make way for one proc per GPU, each
-- pinned to its own (NCCL takes one rank per GPU).
local on_gpu, device_line = false, "device: cpu (mlp, OpenBLAS)"
if opts.device ~= "cpu" then
  local info, why = gpu.info(procs)
  if info then
    local ok, err = pcall(procs.load, procs, "cuda_mlp")
    if ok then
      on_gpu = true
      device_line = string.format("device: gpu, %d x %s per host (cuda_mlp, cuBLAS; gradients all-reduced by NCCL)",
        info.count, info.name)
      procs:stop()
      procs = monarch.hosts():spawn_procs{ procs = info.count, gpus = info.count }
    else
      why = "cuda_mlp does not load: " .. tostring(errors.is(err) and err.message or err)
    end
  end
  if not on_gpu then
    if opts.device == "gpu" then die("--device gpu: " .. tostring(why)) end
    device_line = device_line .. "; no GPU used: " .. tostring(why)
  end
end

local restartable = procs.ready ~= nil
if restartable then procs = procs:options{ restart = true } end

-- A host lost for good: noted here, handled where the step that failed is (shrink, below).
local lost_hosts = {}
local elastic = not on_gpu -- the per-step backup uses basic's copy, a CPU kernel
monarch.on_host_loss(function(ev)
  ev.at = monarch.now()
  lost_hosts[#lost_hosts + 1] = ev
end)
-- Hosts that joined and wait for the next step (grow_onto, below), and how many joined in all.
local joined, joins = {}, 0
local hosts = monarch.hosts()
local initial_hosts = { unpack(hosts.agents) } -- before any joined
if hosts.on_join then
  hosts:on_join(function(a)
    joined[#joined + 1] = a
    joined.at = joined.at or monarch.now()
    joins = joins + 1
  end)
end
local world = procs:size()
local rank0 = procs:slice{ hosts = 0, procs = 0 }

--- Loads the kernels on every proc: mlp, and on GPUs cuda_mlp after it, so
-- that its model kernels shadow mlp's and digits_load stays mlp's.
local function load_kernels()
  procs:load "mlp"
  if elastic then procs:load "basic" end
  if on_gpu then procs:load "cuda_mlp" end
end
load_kernels()

local tf, seed, batch, hidden = opts["test-fraction"], opts.seed, opts.batch, opts.hidden
local info = procs:call("digits_info", data, tf):get()[1]
local rows, features, classes, n_train, n_test, shard = unpack(info)
local steps_per_epoch = math.floor(shard / batch)
if steps_per_epoch < 1 then
  error(string.format("train.lua: each of %d procs holds %d training rows, fewer than --batch %d", world, shard, batch), 0)
end
if n_test < 1 then
  error(string.format("train.lua: --test-fraction %g of %d rows holds out no rows to test on", tf, rows), 0)
end
local total_steps = opts.steps or opts.epochs * steps_per_epoch
local nparams = features * hidden + hidden + hidden * classes + classes

--- Allocates every tensor on every proc and loads the data shards. Called at
-- the start and again after procs were restarted (a new proc has nothing).
local function setup()
  local function new(dtype, shape)
    if on_gpu then return procs:gpu_tensor(dtype, shape) end
    return procs:tensor(dtype, shape)
  end
  local st = {
    P = new("f32", { nparams }),      -- parameters: W1 | b1 | W2 | b2
    G = new("f32", { nparams }),      -- gradients, same layout
    S = new("f32", { 2 * nparams }),  -- Adam moments m | v
  }
  if elastic then -- P and S as they were before the step now running: what survivors go on from
    st.P0, st.S0 = new("f32", { nparams }), new("f32", { 2 * nparams })
  end
  local data_shapes = { X = { "f32", { shard, features } }, Y = { "i32", { shard } },
    Xt = { "f32", { n_test, features } }, Yt = { "i32", { n_test } } }
  local cpu = {}
  for name, d in pairs(data_shapes) do cpu[name] = procs:tensor(d[1], d[2]) end
  procs:call("digits_load", data, tf, seed, cpu.X, cpu.Y, cpu.Xt, cpu.Yt):get()
  if not on_gpu then
    for name, t in pairs(cpu) do st[name] = t end
    return st
  end
  -- On GPUs: each proc copies its own shard from its CPU tensors to its GPU.
  for name, d in pairs(data_shapes) do
    st[name] = new(d[1], d[2])
    procs:call("mlp_copy", cpu[name], st[name]):get()
    cpu[name]:free()
  end
  return st
end

local function free_state(st)
  for _, t in pairs(st) do t:free() end
end

local st = setup()

-- The parameters and optimizer state as bytes, from rank 0 only.
local function fetch_state(step)
  local p = rank0:call_one("mlp_bytes", st.P)
  local s = rank0:call_one("mlp_bytes", st.S)
  return { step = step, P = p:get(), S = s:get() }
end

local function put_state(snap)
  local a, b = st.P:put(snap.P), st.S:put(snap.S)
  a:get()
  b:get()
end

-- ---- checkpoints ---------------------------------------------------------------------------

local meta = {
  model = "mlp-relu-softmax", features = features, hidden = hidden, classes = classes,
  procs = world, batch = batch, lr = opts.lr, seed = seed, test_fraction = tf, rows = rows,
}

local function save_checkpoint(snap)
  local path = checkpoint.write(opts["checkpoint-dir"], {
    step = snap.step, meta = meta,
    sections = { { name = "params", bytes = snap.P }, { name = "adam", bytes = snap.S } },
  }, { keep = opts.keep })
  return path
end

local function load_checkpoint()
  local ck, where, rejected
  if opts["resume-from"] then
    where = opts["resume-from"]
    local err
    ck, err = checkpoint.read(where)
    if not ck then die("cannot resume: " .. err) end
  else
    ck, where, rejected = checkpoint.latest(opts["checkpoint-dir"])
    for _, why in ipairs(rejected or {}) do note("resume: skipping %s", why) end
    if not ck then die("cannot resume: " .. where) end
  end
  for _, k in ipairs { "features", "hidden", "classes" } do
    if ck.meta[k] ~= tostring(meta[k]) then
      error(string.format("train.lua: cannot resume from %s: it has %s=%s but this run has %s=%s",
        where, k, tostring(ck.meta[k]), k, tostring(meta[k])), 0)
    end
  end
  local P, S = ck.by_name.params, ck.by_name.adam
  if not P or #P ~= 4 * nparams or not S or #S ~= 8 * nparams then
    die("cannot resume from " .. where .. ": its params/adam sections do not fit this model")
  end
  for _, k in ipairs { "procs", "batch", "lr", "seed", "test_fraction" } do
    if ck.meta[k] ~= tostring(meta[k]) then
      note("resume: note: the checkpoint has %s=%s, this run %s=%s; the result will differ from an uninterrupted run",
        k, tostring(ck.meta[k]), k, tostring(meta[k]))
    end
  end
  return { step = ck.step, P = P, S = S }, where
end

-- ---- gradient all-reduce ------------------------------------------------------------------

local have_all_reduce = procs.all_reduce ~= nil

--- Fallback while ProcMesh:all_reduce is missing: sums every proc's gradient on
-- the controller in rank order (float32, like a kernel would) and puts the sum
-- back on every proc.
local function all_reduce_on_controller(G)
  local copies = G:fetch():get()
  local n = G.numel
  local acc = ffi.new("float[?]", n)
  for r = 1, copies:size() do
    local d = copies[r].data
    for j = 0, n - 1 do acc[j] = acc[j] + d[j] end
  end
  G:put(ffi.string(acc, 4 * n)):get()
end

local function all_reduce(G)
  if have_all_reduce then
    procs:all_reduce(G, "sum"):get()
  else
    all_reduce_on_controller(G)
  end
end

-- ---- one step ---------------------------------------------------------------------------------

local metrics = {} -- metrics[step] = {loss_sum, correct, samples}; a replayed step overwrites its entry

-- Keeps each proc's own copy of P and S from before a step (basic's copy, on the proc).
local function backup()
  if not elastic then return end
  procs:call("copy", st.P, st.P0)
  procs:call("copy", st.S, st.S0)
end
local injected = {}

--- Runs step s (0-based): gradients on every proc, all-reduce, Adam.
-- Raises if any proc fails; then the procs' state is undefined until restored.
local function train_step(s)
  local epoch, k = math.floor(s / steps_per_epoch), s % steps_per_epoch
  if opts["kill-at"] == s and not injected.kill then
    injected.kill = true
    if not restartable then die("--kill-at needs restart support (ProcMesh:ready)") end
    procs:load "faulty"
    -- Its future fails with the proc; the step's own calls report the failure.
    procs:slice{ hosts = 0, procs = procs:size("procs") - 1 }:call_one("exit", 9)
    injected.killed_at, injected.killed = monarch.now(), "proc was killed"
  end
  if opts["kill-host-at"] == s and not injected.kill_host then
    injected.kill_host = true
    if #initial_hosts < 2 then die("--kill-host-at needs at least two hosts (--hosts)") end
    os.execute("kill -9 " .. initial_hosts[#initial_hosts].pid) -- the last host the run started with
    injected.killed_at, injected.killed = monarch.now(), "host was killed"
  end
  backup()
  local fb = procs:call("mlp_forward_backward", st.P, st.X, st.Y, st.G, hidden, classes, batch, seed, epoch, k)
  all_reduce(st.G)
  local upd = procs:call("mlp_adam", st.P, st.G, st.S, opts.lr, s + 1, 1 / world)
  local results = fb:get()
  upd:get()
  if opts["fail-at"] == s and not injected.fail then
    -- The update above has already moved every proc on: recovery must undo it.
    injected.fail = true
    error(errors.new { kind = "proc_failed", message = "simulated failure at step " .. s .. " (--fail-at)" }, 0)
  end
  local loss, correct = 0, 0
  for r = 1, results:size() do
    loss = loss + results[r][1]
    correct = correct + results[r][2]
  end
  metrics[s] = { loss, correct, batch * world }
end

--- Runs steps s .. s+n-1 (0-based) in one call per proc: mlp_train does each
-- step's gradient, an in-kernel all_reduce over the group and Adam, the same
-- arithmetic in the same order as train_step, so the weights come out
-- bitwise the same. A failure tears the group down; the next call makes a new one.
local kgroup
local function train_fused(s, n)
  if not kgroup or kgroup._dead then kgroup = procs:group() end
  backup()
  local r = procs:call("mlp_train", kgroup, st.P, st.X, st.Y, st.G, hidden, classes, batch, st.S, seed, opts.lr, s, n,
    steps_per_epoch):get()
  for i = 0, n - 1 do
    local loss, correct = 0, 0
    for p = 1, r:size() do
      loss = loss + r[p][2 * i + 1]
      correct = correct + r[p][2 * i + 2]
    end
    metrics[s + i] = { loss, correct, batch * world }
  end
end

local function evaluate()
  local r = rank0:call_one("mlp_evaluate", st.P, st.Xt, st.Yt, hidden, classes):get()
  return r[1] / r[3], r[2] / r[3], r[2], r[3]
end

-- ---- recovery ---------------------------------------------------------------------------------

local snapshot
local recoveries = 0

--- After a failed step: waits for the mesh to be whole again, rebuilds every
-- proc's state and puts back the last consistent parameters. Returns the step
-- to continue from. Raises err again when it is not a recoverable failure.
local PROC_LOST = { proc_failed = true, unresponsive = true, host_lost = true }

--- Whether err comes from a proc that died. The survivors of a collective
-- fail too ("lost the link from rank 3"), and their error may be the one that
-- arrived first; the failures of the other procs, or the mesh, tell.
local function proc_was_lost(err)
  if not errors.is(err) then return false end
  if PROC_LOST[err.kind] then return true end
  for _, f in ipairs(err.failures or {}) do
    if errors.is(f) and PROC_LOST[f.kind] then return true end
  end
  if err.kind == "collective" or err.kind == "host_lost" then
    for _, p in ipairs(procs:procs()) do
      if p.state ~= "ready" then return true end
    end
  end
  return false
end

--- After a step failed because hosts were lost: goes on with the surviving
-- hosts from step s. Their procs put back P and S from before the step, the
-- lost procs' shards drop out, and gradients are averaged over the procs
-- left. Returns s, or nil when no host of the mesh was lost.
local resume_clock -- set by shrink: when the hosts were lost, until the survivors have taken a step
local function shrink(s)
  local survivors, dropped = procs:survivors()
  if dropped == 0 then return nil end
  local before = world
  -- Measured from the kill when this run made it (--kill-host-at), else from the loss event.
  resume_clock = { what = "elastic" }
  resume_clock.at = injected.killed_at or (lost_hosts[1] and lost_hosts[1].at) or monarch.now()
  lost_hosts = {}
  procs, world, kgroup = survivors, survivors:size(), nil
  rank0 = procs:slice{ hosts = 0, procs = 0 }
  for k, t in pairs(st) do st[k] = t:on(procs) end
  procs:call("copy", st.P0, st.P)
  procs:call("copy", st.S0, st.S):get()
  snapshot = fetch_state(s)
  note("elastic: %d procs lost; training goes on with %d procs on %d hosts from step %d: global batch %d -> %d, "
    .. "gradients averaged over %d procs", dropped, world, procs:size("hosts"), s + 1, batch * before, batch * world,
    world)
  return s
end

local function recover(err, s)
  local failed_at = monarch.now()
  if elastic and proc_was_lost(err) then
    local at = shrink(s)
    if at then return at end
  end
  local simulated = opts["fail-at"] ~= nil and injected.fail and not injected.recovered_fail
  if not (proc_was_lost(err) and (restartable or simulated)) then error(err, 0) end
  recoveries = recoveries + 1
  if recoveries > MAX_RECOVERIES then
    error("train.lua: giving up after " .. MAX_RECOVERIES .. " failed steps; last: " .. tostring(err), 0)
  end
  if simulated then injected.recovered_fail = true end
  note("step %d failed: %s", s + 1, tostring(err))
  if restartable then
    note("recovery: waiting up to %d s for the mesh to be whole", READY_TIMEOUT)
    procs:ready(READY_TIMEOUT)
  end
  free_state(st)
  load_kernels() -- a restarted proc has loaded nothing
  st = setup()
  put_state(snapshot)
  note("recovery: restored the weights of step %d; replaying %d step(s)", snapshot.step, s - snapshot.step)
  resume_clock = { what = "recovery", at = injected.killed_at or failed_at }
  return snapshot.step
end

-- ---- the run ----------------------------------------------------------------------------------

local start_step = 0
if opts.resume or opts["resume-from"] then
  local snap, where = load_checkpoint()
  put_state(snap)
  start_step = snap.step
  note("resumed from %s (step %d)", where, start_step)
else
  procs:call("mlp_init", st.P, features, hidden, classes, seed):get()
end
snapshot = fetch_state(start_step)

say("digits: %d rows of %d features, %d classes; %d for training (%d per proc), %d held out",
  rows, features, classes, n_train, shard, n_test)
say("model: %d -> %d (ReLU) -> %d, %d parameters; Adam lr %g", features, hidden, classes, nparams, opts.lr)
say("%s%s", device_line, opts.fused and not on_gpu and string.format("; %d steps per call (mlp_train)", opts.fused) or "")
say("training on %d procs: batch %d per proc (%d global), %d steps per epoch, %d steps%s",
  world, batch, batch * world, steps_per_epoch, total_steps,
  have_all_reduce and "" or "; gradients summed on the controller (ProcMesh:all_reduce not available)")
if start_step >= total_steps then note("the checkpoint is already at step %d of %d: nothing to train", start_step, total_steps) end

local t_start = monarch.now()
local t_epoch, t_train, samples = t_start, 0, 0
local last_draw = 0
local epoch_times = {}
local last_ckpt

local function epoch_stats(e, upto)
  local loss, correct, n = 0, 0, 0
  for s = e * steps_per_epoch, upto - 1 do
    local m = metrics[s]
    if m then
      loss, correct, n = loss + m[1], correct + m[2], n + m[3]
    end
  end
  return n > 0 and loss / n or 0, n > 0 and correct / n or 0
end

local function progress(s, rate)
  if opts.quiet then return end
  local e = math.floor((s - 1) / steps_per_epoch)
  local loss, acc = epoch_stats(e, s)
  local now = monarch.now()
  local line = string.format("step %d/%d  epoch %d/%d  loss %.4f  acc %5.1f%%  %6.0f samples/s",
    s, total_steps, e + 1, math.ceil(total_steps / steps_per_epoch), loss, 100 * acc, rate)
  if tty then
    if now - last_draw < REDRAW_INTERVAL and s < total_steps then return end
    last_draw = now
    local filled = math.floor(BAR_WIDTH * s / total_steps)
    io.stdout:write("\r\027[K[", string.rep("=", filled), string.rep(" ", BAR_WIDTH - filled), "] ", line)
    io.stdout:flush()
    bar_shown = true
  elseif s % opts["log-every"] == 0 then
    io.stdout:write(line, "\n")
    io.stdout:flush()
  end
end

--- Runs step s and what follows it (progress, the epoch's evaluation, the
-- snapshot and the checkpoint); returns s + 1. Raises if a proc fails.
local function fused_count(s)
  local n = math.min(opts.fused, total_steps - s, steps_per_epoch - s % steps_per_epoch,
    opts["snapshot-every"] - s % opts["snapshot-every"])
  if opts.every > 0 then n = math.min(n, opts.every - s % opts.every) end
  for _, at in ipairs { opts["fail-at"], opts["kill-at"] } do -- the failure tests inject at a step
    if at and at >= s and at < s + n then n = math.max(1, at - s) end
  end
  return n
end

local function advance(s)
  local t0 = monarch.now()
  local n = 1
  if opts.fused and not on_gpu then
    n = fused_count(s)
    if n > 1 or not (opts["fail-at"] == s or opts["kill-at"] == s) then train_fused(s, n) else train_step(s) end
  else
    train_step(s)
  end
  t_train = t_train + (monarch.now() - t0)
  if resume_clock then
    note("%s: stepping again %.3f s after the %s", resume_clock.what, monarch.now() - resume_clock.at,
      resume_clock.since or injected.killed or "failure was reported")
    resume_clock, injected.killed_at, injected.killed = nil, nil, nil
  end
  samples = samples + n * batch * world
  s = s + n
  progress(s, samples / t_train)
  if s % steps_per_epoch == 0 or s == total_steps then
    local e = math.floor((s - 1) / steps_per_epoch)
    local loss, acc = epoch_stats(e, s)
    local tl, ta = evaluate()
    local now = monarch.now()
    epoch_times[#epoch_times + 1] = now - t_epoch
    t_epoch = now
    clear_bar()
    say("epoch %2d  loss %.4f  train acc %5.1f%%  test loss %.4f  test acc %5.1f%%  %.3f s",
      e + 1, loss, 100 * acc, tl, 100 * ta, epoch_times[#epoch_times])
  end
  local ckpt_due = opts.every > 0 and (s % opts.every == 0 or s == total_steps)
  if s % opts["snapshot-every"] == 0 or ckpt_due or s == total_steps then
    snapshot = fetch_state(s)
    if ckpt_due then last_ckpt = save_checkpoint(snapshot) end
  end
  return s
end

--- Before step s: the hosts that joined get procs (ProcMesh:grow), which
-- receive every tensor from a healthy peer (Tensor:copy_from_peer: the
-- weights, the Adam state, and that peer's data shard; each samples its
-- own batches from it, by rank) and take part from step s on.
local function grow_onto(s)
  local agents, since = joined, joined.at
  joined = {}
  local before = world
  local grown, added = procs:grow(agents)
  for _, t in pairs(st) do t:copy_from_peer(grown):get() end
  procs, world, kgroup = grown, grown:size(), nil
  rank0 = procs:slice{ hosts = 0, procs = 0 }
  snapshot = fetch_state(s)
  note("elastic: %d host(s) joined with %d procs; training goes on with %d procs on %d hosts from step %d: "
    .. "global batch %d -> %d, gradients averaged over %d procs", #agents, added:size(), world, procs:size("hosts"),
    s + 1, batch * before, batch * world, world)
  resume_clock = { what = "elastic", at = since, since = "host joined" }
end

--- --wait-join-at N: holds step N until a host has joined in this run (for tests and the bench).
local function wait_join(s)
  if opts["wait-join-at"] ~= s or injected.waited_join then return end
  injected.waited_join = true
  if not hosts.on_join then die("--wait-join-at needs join support (monarch-run --listen-joins ADDR)") end
  if joins > 0 then return end
  note("waiting for a host to join (monarch-worker --join)")
  local deadline = monarch.now() + 60
  while joins == 0 and monarch.now() < deadline do monarch.sleep(0.01) end
  if joins == 0 then die("--wait-join-at " .. s .. ": no host joined within 60 s") end
end

local s = start_step
while s < total_steps do
  wait_join(s)
  if #joined > 0 and elastic then
    local ok, err = pcall(grow_onto, s)
    if not ok then -- a host that went again before its procs had the state: go on without it
      note("elastic: a host joined but could not take part: %s", tostring(err))
      for k, t in pairs(st) do st[k] = t:on(procs) end
    end
  end
  local ok, res = pcall(advance, s)
  if ok then s = res else s = recover(res, s) end
end
clear_bar()
local total_time = monarch.now() - t_start

-- ---- summary ----------------------------------------------------------------------------------

-- Every proc must hold the same parameters and optimizer state, byte for byte.
local function check_identical(t, what)
  local copies = t:fetch():get()
  local ref = copies[1]:bytes()
  for r = 2, copies:size() do
    if copies[r]:bytes() ~= ref then
      error(string.format("train.lua: %s differ between rank 0 and rank %d", what, r - 1), 0)
    end
  end
  return ref
end
local params = check_identical(st.P, "weights")
check_identical(st.S, "Adam states")

local test_loss, test_acc, test_correct, test_n = evaluate()
local mean_epoch = 0
for _, t in ipairs(epoch_times) do mean_epoch = mean_epoch + t end
mean_epoch = #epoch_times > 0 and mean_epoch / #epoch_times or 0
note("done: %d steps (%.1f epochs) in %.2f s; %.3f s per epoch; %.0f samples/s",
  total_steps - start_step, (total_steps - start_step) / steps_per_epoch, total_time, mean_epoch,
  t_train > 0 and samples / t_train or 0)
note("test accuracy %.2f%% (%d/%d), test loss %.4f", 100 * test_acc, test_correct, test_n, test_loss)
note("weights identical on all %d procs (%d parameters, crc32 %08x)", world, nparams, checkpoint.crc32(params))
if recoveries > 0 then note("recovered from %d failed step(s)", recoveries) end
if last_ckpt then note("checkpoint: %s", last_ckpt) end

-- ---- curves (--csv, --plot) -------------------------------------------------------------------

--- The steps trained in this run (1-based), with the mean loss and the
-- accuracy of each one's global batch; a replayed step counts once (its
-- metrics entry was overwritten).
local function curves()
  local c = { step = {}, epoch = {}, loss = {}, accuracy = {} }
  for s = start_step, total_steps - 1 do
    local m = metrics[s]
    if m then
      local i = #c.step + 1
      c.step[i], c.epoch[i] = s + 1, math.floor(s / steps_per_epoch) + 1
      c.loss[i], c.accuracy[i] = m[1] / m[3], m[2] / m[3]
    end
  end
  return c
end

local function write_curves()
  local c = curves()
  if #c.step == 0 then
    note("curves: no steps were trained in this run; nothing written")
    return
  end
  if opts.csv then
    local ok, err = plot.write(opts.csv, plot.csv({ "step", "epoch", "loss", "accuracy" },
      { c.step, c.epoch, c.loss, c.accuracy }))
    if not ok then die(err) end
    note("csv: %s (%d steps)", opts.csv, #c.step)
  end
  if opts.plot then
    local pct = {}
    for i, a in ipairs(c.accuracy) do pct[i] = 100 * a end
    local drawn, svg = pcall(plot.svg, {
      title = string.format("train.lua: digits, %d procs x batch %d, lr %g; test accuracy %.1f%%",
        world, batch, opts.lr, 100 * test_acc),
      x = { label = "step", values = c.step },
      y = { label = "loss (the step's batch)", min = 0 },
      y2 = { label = "accuracy % (the step's batch)", min = 0, max = 100 },
      series = { { name = "loss", values = c.loss }, { name = "accuracy", values = pct, axis = "y2" } },
    })
    if not drawn then die(tostring(svg)) end -- a NaN loss, say; the CSV (written first) has it
    local ok, err = plot.write(opts.plot, svg)
    if not ok then die(err) end
    note("plot: %s (%d steps)", opts.plot, #c.step)
  end
end
if opts.plot or opts.csv then write_curves() end
