--- Training as a library: the loop, so that a training script holds only its
-- model, its data and its step (docs/training.md).
--   local train = require "monarch.train"
--   train.run {
--     name = "digits", options = { { "hidden", 128, "int", "hidden units" } },
--     libs = { "mlp" },
--     figures = { { "loss", "%.4f" } },
--     plan = function(job) return { steps_per_epoch = 11 } end,
--     setup = function(job) return { state = { params = job.procs:tensor("f32", { n }) } } end,
--     init = function(job) job.procs:call("init", job.state.params):get() end,
--     step = function(job, s) ...; return { loss = l, samples = n } end,
--   }
-- The library parses the options, spawns the procs, snapshots the state on
-- the procs, recovers a failed step (a proc restarted, a host lost, a host
-- joined), writes and resumes checkpoints, checks that replicas agree, draws
-- the curves, and keeps the job alive on long-lived host agents so that the
-- same command run again (or a --standby controller) takes it over after
-- the controller dies.
local ffi = require "ffi"
local monarch = require "monarch"
local persist = require "monarch.persist"
local plot = require "monarch.plot"
local checkpoint = require "monarch.checkpoint"
local topts = require "monarch.train_opts"
local progress = require "monarch.train_progress"
local mesh_mod = require "monarch.mesh"
local state_mod = require "monarch.train_state"
local ckpt = require "monarch.train_ckpt"
local recover = require "monarch.train_recover"

local errors = monarch.errors
local M = {}
M.FORMAT = 1          -- version of what the job keeps on the agents (meta of its persistent mesh)
M.STANDBY_POLL = 0.1  -- seconds between a standby controller's tries to take the job over

pcall(ffi.cdef, "int getpid(void);")

local Job = {}
Job.__index = Job

-- ---- the job ---------------------------------------------------------------------------

--- A mistake in how the script was run, or a failure it cannot go on from: one line, exit status 1. Run from
-- code (train.run with args: a REPL, a notebook) it raises that line as a MonarchError of kind train instead,
-- the job's own procs stopped, and the session goes on.
function Job:die(msg)
  self.out:clear()
  if self.owned and self.procs then pcall(self.procs.stop, self.procs) end
  if self.raise then error(errors.new { kind = "train", message = self.script_name .. ": " .. msg }, 0) end
  io.stderr:write(self.script_name, ": ", msg, "\n")
  pcall(monarch.shutdown)
  os.exit(1)
end

function Job:say(fmt, ...) self.out:say(fmt, ...) end
function Job:note(fmt, ...) self.out:note(fmt, ...) end

--- A mesh of the first proc alone (for calls one proc answers: an evaluation, sizes).
function Job:first() return mesh_mod.flat({ self.procs:proc_list()[1] }, self.procs._libs) end

--- Procs and hosts, as the script sees them now.
function Job:world() return self.procs:size() end
function Job:nhosts() return self.procs:size("hosts") or 1 end

local function new_job(spec, args)
  local argv = args or arg or {}
  local script = argv[0] or spec.name or "train"
  local job = setmetatable({ spec = spec, script = script, script_name = script:match("[^/]*$"),
    metrics = {}, recoveries = 0, generation = 0, injected = {}, raise = args ~= nil }, Job)
  job.list = topts.merge(spec.options)
  job.out = progress.new { now = monarch.now }
  job.opts = topts.parse(argv, job.list, function(msg) job:die(msg) end)
  if job.opts.help then
    print(topts.usage(script, spec.about, job.list))
    return nil
  end
  job.out.quiet, job.out.log_every, job.out.unit = job.opts.quiet, job.opts["log-every"], spec.unit or "samples"
  job.name = job.opts.job or spec.name or job.script_name:gsub("%.lua$", "")
  job.identity = topts.identity(job.opts, job.list)
  if job.opts["die-in"] ~= "step" and job.opts["die-in"] ~= "checkpoint" then
    job:die("--die-in must be step or checkpoint, got '" .. tostring(job.opts["die-in"]) .. "'")
  end
  if spec.check then
    local ok, why = spec.check(job.opts)
    if not ok then job:die(why) end
  end
  return job
end

-- Whether the job's host agents outlive this controller, so that the job can: not the local agent monarch-run
-- starts for itself, nor Ray's, which go with the controller (monarch.hosts_from; monarch.hosts() was called).
local function long_lived() return monarch.hosts_from ~= "local" and monarch.hosts_from ~= "ray" end

function Job:mesh_name() return "train/" .. self.name end

-- ---- procs and state -----------------------------------------------------------------

-- Spawns the procs (the script's spawn, or procs = --procs on every host) and loads the libraries.
function Job:spawn()
  local procs = self.spec.spawn and self.spec.spawn(self) or monarch.hosts():spawn_procs{ procs = self.opts.procs }
  if procs.ready then procs = procs:options{ restart = true } end
  procs:load "basic"
  procs:load "shard"
  local libs = self.spec.libs
  if type(libs) == "function" then libs = libs(self) end
  for _, lib in ipairs(libs or {}) do procs:load(lib) end
  self.procs, self.owned = procs, true
  return procs
end

--- The steps of the run, from the script's plan: total (from --steps or --epochs) and steps_per_epoch.
function Job:plan()
  local p = self.spec.plan and self.spec.plan(self) or {}
  self.epoch_steps = p.steps_per_epoch or 1
  if self.epoch_steps < 1 then self:die(p.why or "an epoch has no steps") end
  self.total = self.opts.steps or p.steps or (self.opts.epochs or 1) * self.epoch_steps
end

-- Makes the state of a fresh mesh: the script's setup, its data, its initial weights or a checkpoint's.
function Job:fresh(resume)
  self:spawn()
  self:plan()
  self.st = state_mod.new(self.procs, self.spec.setup(self), self:replicate())
  self:bind()
  if self.spec.load then self.spec.load(self) end
  self.start_step = 0
  if resume then
    self.start_step = recover.resume(self)
  elseif self.spec.init then
    self.spec.init(self)
  end
  recover.snapshot(self, self.start_step)
end

--- The dimension(s) the state is replicated along (nil: on every proc alike; a name or a list of names):
-- spec.replicate, or its function's.
function Job:replicate()
  local r = self.spec.replicate
  if type(r) == "function" then return r(self) end
  return r
end

--- job.state, job.data, job.work: the tensors by name (the script reads them here; they change on recovery).
function Job:bind()
  self.state, self.data, self.work = self.st.live, self.st.data, self.st.work
  self.generation = self.generation + 1
end

--- Keeps the job on the agents (long-lived ones only): after a world change too, since pids change.
function Job:keep()
  if not self.persistent or self.st.on_gpu then return end
  local ok, err = pcall(self.procs.persist, self.procs, self:mesh_name(), self.st:named(),
    { format = M.FORMAT, identity = self.identity, names = self.st.names, job = self.name })
  if not ok then
    self.persistent = false
    self:note("controller loss: the job cannot be kept on the host agents (%s); a new controller would start over",
      tostring(errors.is(err) and err.message or err))
  end
end

-- ---- taking over a job ------------------------------------------------------------------

-- The first option where the job on the agents and this run differ, as "name: theirs vs ours"; nil if none.
local function differs(theirs, ours)
  local t, o = {}, {}
  for _, kv in ipairs(theirs or {}) do t[kv:match("^[^=]*")] = kv end
  for _, kv in ipairs(ours) do o[kv:match("^[^=]*")] = kv end
  for k, v in pairs(o) do if t[k] ~= v then return string.format("%s, this run %s", t[k] or (k .. " unset"), v) end end
  for k, v in pairs(t) do if not o[k] then return string.format("%s, this run %s unset", v, k) end end
end

-- Tries to attach the job's mesh: the mesh, or nil when no agent keeps it; waits while another controller holds
-- it with --standby, and refuses without.
function Job:find()
  local name, waiting = self:mesh_name(), false
  while true do
    local ok, m = pcall(persist.attach, name)
    if ok then return m end
    local msg = errors.is(m) and m.message or tostring(m)
    local held = errors.is(m) and m.held == true
    if held and not self.opts.standby then
      self:die(string.format("job '%s' is driven by another controller, which is still connected to its hosts; "
        .. "--standby waits to take it over when that one dies, --job NAME runs another job", self.name))
    end
    if not self.opts.standby then return nil end
    if not waiting then
      waiting = true
      self:note("standby: waiting to take over job '%s' when its controller dies", self.name)
    end
    local gone = errors.is(m) and m.unknown == true
    if held then self.seen_held = true elseif gone and self.seen_held then
      self:note("standby: job '%s' ended under its controller; nothing to take over", self.name)
      pcall(monarch.shutdown)
      os.exit(0)
    elseif not gone and msg ~= self.last_why then
      self.last_why = msg
      self:note("standby: cannot take job '%s' over yet: %s", self.name, msg)
    end
    monarch.sleep(M.STANDBY_POLL)
  end
end

-- Goes on with the attached mesh m from the procs' own state; returns false when it must start over.
function Job:take_over(m, t0)
  local meta = m.meta or {}
  local dead = 0
  for _, p in ipairs(m:proc_list()) do if p.state ~= "ready" then dead = dead + 1 end end
  local why = meta.format ~= M.FORMAT and ("it was kept in format " .. tostring(meta.format)) or nil
  local diff = differs(meta.identity, self.identity)
  if diff and not self.opts.fresh then
    self:die(string.format("job '%s' on the host agents was started with %s: --fresh ends it and starts anew, "
      .. "--job NAME runs another job", self.name, diff))
  end
  if self.opts.fresh or why or dead > 0 then
    if dead > 0 then why = dead .. " of its procs exited while no controller held it" end
    if why then self:note("controller: job '%s' cannot go on from its procs (%s): starting over", self.name, why) end
    m:stop()
    return false
  end
  self.procs = m:options{ restart = m.ready ~= nil }
  self.owned = true
  self:plan()
  local st, serr = state_mod.from_named(self.procs, m.tensors, meta.names or {}, self:replicate())
  if not st then self:die("cannot take over job '" .. self.name .. "': " .. serr) end
  self.st = st
  self:bind()
  local c = assert(st:restore())
  recover.snapshot(self, c)
  self.start_step = c
  self.resume_clock = { what = "controller", at = t0, since = "new controller started" }
  self:note("controller: took over job '%s' (%d procs on %d hosts) at step %d from the procs' own state in %.3f s; "
    .. "no checkpoint read", self.name, self:world(), self:nhosts(), c, monarch.now() - t0)
  return true
end

-- The file that says this job is running, beside its checkpoints: a run that finds it, and no job on the agents,
-- knows that the procs died with the controller, and resumes from the newest checkpoint.
function Job:marker() return self.opts["checkpoint-dir"] .. "/.running-" .. self.name:gsub("[^%w%-_.]", "_") end

function Job:mark(on)
  if not on then return os.remove(self:marker()) end
  if self.opts.every == 0 then return end
  pcall(checkpoint.mkdirs, self.opts["checkpoint-dir"])
  local f = io.open(self:marker(), "w")
  if f then
    f:write(string.format("pid %d\n", ffi.C.getpid()))
    f:close()
  end
end

--- Starts the run: takes the job over from the agents when they keep it, else a fresh mesh (from a checkpoint
-- with --resume or --resume-from, or when the job's procs were lost with the old controller).
function Job:start()
  local t0 = monarch.now()
  recover.watch(self)
  self.persistent = long_lived()
  local resume = self.opts.resume or self.opts["resume-from"] ~= nil
  if self.persistent then
    local m = self:find()
    if m then
      local ok = self:take_over(m, t0)
      if ok then
        recover.whole(self)
        return self:keep()
      end
    end
    local f = not resume and not self.opts.fresh and io.open(self:marker(), "r")
    if f then
      f:close()
      local have = #ckpt.candidates(self.opts["checkpoint-dir"]) > 0
      self:note("controller: job '%s' was running, but its procs are gone%s", self.name,
        have and ": resuming from the newest checkpoint" or " and it has no checkpoint: starting over")
      resume = have
    end
    self:mark(true)
  end
  self:fresh(resume)
  recover.whole(self)
  self:keep()
end

-- ---- the loop ----------------------------------------------------------------------------

-- Steps one call of the script's step may run from s (for scripts that run several per call: --fused): to the
-- epoch's end (its evaluation), the next checkpoint, or a testing injection.
function Job:limit(s)
  local o = self.opts
  local n = math.min(self.total - s, self.epoch_steps - s % self.epoch_steps)
  if o.every > 0 then n = math.min(n, o.every - s % o.every) end
  for _, k in ipairs { "fail-at", "kill-at", "kill-host-at", "die-at" } do -- names: an unset one is nil
    local at = o[k]
    if at and at >= s and at < s + n then n = math.max(1, at - s) end
  end
  return n
end

-- The figures of the steps of epoch e up to step upto (0-based, exclusive): the samples-weighted mean of each.
function Job:epoch_figures(e, upto)
  local sums, n = {}, 0
  for s = e * self.epoch_steps, upto - 1 do
    local m = self.metrics[s]
    if m then
      local w = m.samples or 1
      n = n + w
      for _, f in ipairs(self.spec.figures or {}) do sums[f[1]] = (sums[f[1]] or 0) + (m[f[1]] or 0) * w end
    end
  end
  local out = {}
  for i, f in ipairs(self.spec.figures or {}) do
    out[i] = { f[1], n > 0 and sums[f[1]] / n * (f.scale or 1) or 0, f[2] }
  end
  return out
end

-- After steps up to s (exclusive) are done: progress, the epoch's evaluation, the checkpoint.
function Job:after(s, n)
  self.samples = self.samples + n
  local e = math.floor((s - 1) / self.epoch_steps)
  if not self.opts.quiet then
    local left = (self.total - s) * (self.t_train / math.max(1, s - self.start_step))
    self.out:step(s, self.total, e + 1, math.ceil(self.total / self.epoch_steps), self:epoch_figures(e, s),
      self.samples / math.max(self.t_train, 1e-9), left)
  end
  if (s % self.epoch_steps == 0 or s == self.total) and self.spec.evaluate then
    local figs = self.spec.evaluate(self)
    local now = monarch.now()
    self.epoch_times[#self.epoch_times + 1] = now - self.t_epoch
    self.t_epoch = now
    local parts = {}
    for i, f in ipairs(self:epoch_figures(e, s)) do parts[i] = string.format("%s " .. f[3], f[1], f[2]) end
    for _, f in ipairs(figs or {}) do parts[#parts + 1] = string.format("%s " .. (f[3] or "%.4f"), f[1], f[2]) end
    self:say("epoch %2d  %s  %.3f s", e + 1, table.concat(parts, "  "), self.epoch_times[#self.epoch_times])
  end
  local o = self.opts
  if o.every > 0 and (s % o.every == 0 or s == self.total) then self.last_ckpt = recover.checkpoint(self, s) end
  -- A snapshot once --snapshot-every steps have passed (at a call's end: a fused call may run several).
  if s - self.snap_step >= o["snapshot-every"] and s < self.total then recover.snapshot(self, s) end
  if self.spec.on_progress then self.spec.on_progress(self, s) end
end

-- Runs the steps from s; returns the step after them. Raises if a proc fails.
function Job:advance(s)
  recover.inject(self, s)
  local t0 = monarch.now()
  local r = self.spec.step(self, s, self:limit(s)) or {}
  self.t_train = self.t_train + (monarch.now() - t0)
  recover.snapshot_pending(self)
  recover.after_failure_injection(self, s)
  local n, samples = 1, 0
  if type(r[1]) == "table" then -- several steps: one figure table each
    n = #r
    for i, figs in ipairs(r) do
      self.metrics[s + i - 1] = figs
      samples = samples + (figs.samples or 0)
    end
  else
    self.metrics[s], samples = r, r.samples or 0
  end
  if self.resume_clock then recover.stepping_again(self) end
  self:after(s + n, samples)
  return s + n
end

function Job:loop()
  self.t_start, self.t_train, self.samples, self.epoch_times = monarch.now(), 0, 0, {}
  self.t_epoch = self.t_start
  if self.start_step >= self.total then
    self:note("already at step %d of %d: nothing to train", self.start_step, self.total)
  end
  local s = self.start_step
  while s < self.total do
    recover.before_step(self, s)
    local ok, res = pcall(self.advance, self, s)
    if ok then s = res else s = recover.failed(self, res, s) end
  end
  self.out:clear()
  self.t_total = monarch.now() - self.t_start
end

-- ---- the end -------------------------------------------------------------------------------

-- The steps trained in this run with each one's figures, as columns for monarch.plot.
function Job:curves()
  local figs = self.spec.figures or {}
  local c = { step = {}, epoch = {} }
  for _, f in ipairs(figs) do c[f.curve or f[1]] = {} end
  for s = self.start_step, self.total - 1 do
    local m = self.metrics[s]
    if m then
      local i = #c.step + 1
      c.step[i], c.epoch[i] = s + 1, math.floor(s / self.epoch_steps) + 1
      for _, f in ipairs(figs) do c[f.curve or f[1]][i] = m[f[1]] or 0 end
    end
  end
  return c
end

--- The curves of the steps trained so far as a monarch.plot spec (c: Job:curves(), made when not given).
function Job:plot_spec(c)
  c = c or self:curves()
  local spec = { title = self.spec.title and self.spec.title(self) or (self.script_name .. ": " .. self.name),
    x = { label = "step", values = c.step }, series = {} }
  for _, f in ipairs(self.spec.figures or {}) do
    local vals, axis = {}, f.axis or "y"
    for i, v in ipairs(c[f.curve or f[1]]) do vals[i] = v * (f.scale or 1) end
    spec[axis] = spec[axis] or { label = f.label or f[1], min = f.min, max = f.max }
    spec.series[#spec.series + 1] = { name = f.curve or f[1], values = vals, axis = f.axis }
  end
  return spec
end

function Job:write_curves()
  local c, figs = self:curves(), self.spec.figures or {}
  if #c.step == 0 then return self:note("curves: no steps were trained in this run; nothing written") end
  if self.opts.csv then
    local header, cols = { "step", "epoch" }, { c.step, c.epoch }
    for _, f in ipairs(figs) do
      header[#header + 1], cols[#cols + 1] = f.curve or f[1], c[f.curve or f[1]]
    end
    local ok, err = plot.write(self.opts.csv, plot.csv(header, cols))
    if not ok then self:die(err) end
    self:note("csv: %s (%d steps)", self.opts.csv, #c.step)
  end
  if self.opts.plot then
    local drawn, svg = pcall(plot.svg, self:plot_spec(c))
    if not drawn then self:die(tostring(svg)) end -- a NaN loss, say; the CSV (written first) has it
    local ok, err = plot.write(self.opts.plot, svg)
    if not ok then self:die(err) end
    self:note("plot: %s (%d steps)", self.opts.plot, #c.step)
  end
end

function Job:finish()
  local crcs = recover.check_identical(self)
  self.final = self.spec.evaluate and self.spec.evaluate(self) or {}
  local mean = 0
  for _, t in ipairs(self.epoch_times) do mean = mean + t end
  mean = #self.epoch_times > 0 and mean / #self.epoch_times or 0
  local done = self.total - self.start_step
  self:note("done: %d steps (%.1f epochs) in %.2f s; %.3f s per epoch; %.0f %s/s", done, done / self.epoch_steps,
    self.t_total, mean, self.t_train > 0 and self.samples / self.t_train or 0, self.out.unit)
  if self.spec.finish then self.spec.finish(self, crcs) end
  if self.recoveries > 0 then self:note("recovered from %d failed step(s)", self.recoveries) end
  if self.last_ckpt then self:note("checkpoint: %s", self.last_ckpt) end
  if self.opts.plot or self.opts.csv then self:write_curves() end
  if self.persistent then -- the job is done: nothing to take over
    self.procs:stop()
    self:mark(false)
  end
end

local function run_job(job)
  job:start()
  if job.spec.started then job.spec.started(job) end
  job:loop()
  job:finish()
end

--- Runs a training script's job (see the top of this file and docs/training.md). Returns the job. args: the
-- options as a list of strings (args[0]: the name shown), for a run from code (a REPL, a notebook); without it,
-- the script's command line (arg), and what stops the run ends the process with one line.
function M.run(spec, args)
  if type(spec) ~= "table" or type(spec.step) ~= "function" or type(spec.setup) ~= "function" then
    error("train.run wants a table with at least setup and step functions", 2)
  end
  if args ~= nil and type(args) ~= "table" then error("train.run: args wants a list of strings", 2) end
  local job = new_job(spec, args)
  if not job then return nil end
  if not args then -- a script's: the process ends with it (and a raise keeps its traceback)
    run_job(job)
    recover.unwatch(job)
    return job
  end
  local ok, err = xpcall(run_job, function(e) -- a plain error keeps where it came from
    return errors.is(e) and e or debug.traceback(tostring(e), 2)
  end, job)
  recover.unwatch(job)
  if not ok then error(err, 0) end
  return job
end

M.Job = Job
return M
