--- What monarch.train does around a step: snapshots, checkpoints and
-- resume, recovery of a failed step (a restarted proc, a lost host), the
-- hosts that join, the testing injections, and the end-of-run check.
-- Functions take the Job of train.lua.
local ffi = require "ffi"
local monarch = require "monarch"
local checkpoint = require "monarch.checkpoint"
local persist = require "monarch.persist"
local mesh_mod = require "monarch.mesh"
local ckpt = require "monarch.train_ckpt"
local runtime = require "monarch.runtime"

local errors = monarch.errors
local M = {}
M.READY_TIMEOUT = 60   -- seconds to wait for restarted procs
M.MAX_RECOVERIES = 5   -- failed steps tolerated in one run before giving up
M.JOIN_WAIT = 60       -- seconds --wait-join-at waits

pcall(ffi.cdef, "int getpid(void);")

-- ---- snapshots and checkpoints -----------------------------------------------------------

-- On GPUs the snapshot is bytes on the controller, fetched with the script's bytes kernel from the first proc.
local function host_snapshot(job, s)
  local k = job.spec.bytes_kernel or job:die("state on GPUs needs the script's bytes_kernel (a tensor's bytes)")
  local first = job:first()
  local snap = { step = s, bytes = {} }
  for _, n in ipairs(job.st.names) do snap.bytes[n] = first:call_one(k, job.st.live[n]:on(first)):get() end
  job.host_snap = snap
end

--- The procs copy the state of step s (one call each, not waited for: they run it before the next step's calls).
function M.snapshot(job, s)
  job.snap_step = s
  if job.st.on_gpu then return host_snapshot(job, s) end
  job.pending_snap = job.st:snapshot(s)
end

-- The job's identity as checkpoint meta: job=NAME, opt.NAME=value.
local function meta_of(job)
  local meta = { job = job.name, format = 1 }
  for _, kv in ipairs(job.identity) do
    local k, v = kv:match("^([^=]*)=(.*)$")
    meta["opt." .. k] = v
  end
  return meta
end

--- Writes the checkpoint of step s (each replica group's shard by one of its procs); returns the main file's path.
function M.checkpoint(job, s)
  local o = job.opts
  if job.st.on_gpu then
    host_snapshot(job, s)
    local secs = {}
    for i, n in ipairs(job.st.names) do secs[i] = { name = n, bytes = job.host_snap.bytes[n] } end
    return checkpoint.write(o["checkpoint-dir"], { step = s, meta = meta_of(job), sections = secs }, { keep = o.keep })
  end
  return ckpt.write(job.st, o["checkpoint-dir"], s, meta_of(job), o.keep, function() M.die_point(job, s, "checkpoint") end)
end

-- Notes how the checkpoint's run differs from this one (the result will then differ from an uninterrupted run).
local function compare(job, meta)
  local mine = meta_of(job)
  local keys = {}
  for k in pairs(mine) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if k:match("^opt%.") and meta[k] ~= nil and meta[k] ~= mine[k] then
      job:note("resume: note: the checkpoint has %s=%s, this run %s=%s; the result will differ from an "
        .. "uninterrupted run", k:sub(5), meta[k], k:sub(5), mine[k])
    end
  end
end

-- Reads the checkpoint at path into the state: its header, or nil and why.
local function read(job, path, only_ours)
  if not job.st.on_gpu then return ckpt.read(job.st, path, only_ours and job.name) end
  local ck, why = checkpoint.read(path)
  if not ck then return nil, why end
  for _, n in ipairs(job.st.names) do
    if not ck.by_name[n] then return nil, path .. ": it has no section '" .. n .. "'" end
    job.st.live[n]:put(ck.by_name[n]):get()
  end
  return ck
end

--- Resumes from --resume-from, or the newest valid checkpoint (--resume); returns its step.
function M.resume(job)
  local o = job.opts
  if o["resume-from"] then
    local h, why = read(job, ckpt.absolute(o["resume-from"]))
    if not h then job:die("cannot resume: " .. why) end
    compare(job, h.meta)
    job:note("resumed from %s (step %d)", o["resume-from"], h.step)
    return h.step
  end
  local rejected = {}
  for _, c in ipairs(ckpt.candidates(o["checkpoint-dir"])) do
    local h, why = read(job, c.path, true)
    if h then
      compare(job, h.meta)
      job:note("resumed from %s (step %d)", c.path, h.step)
      return h.step
    end
    job:note("resume: skipping %s", why)
    rejected[#rejected + 1] = why
  end
  if #rejected == 0 then job:die("cannot resume: no checkpoint (ckpt-*.bin) in " .. o["checkpoint-dir"]) end
  job:die("cannot resume: no valid checkpoint in " .. o["checkpoint-dir"] .. ":\n  " .. table.concat(rejected, "\n  "))
end

-- ---- testing injections ---------------------------------------------------------------------

local function kill_self()
  io.stdout:flush()
  os.execute("kill -9 " .. ffi.C.getpid())
end

-- Kills this controller at the end of the next pump: by then what was sent is on the wire (a pump writes it).
local function kill_after_pump()
  table.insert(runtime.hooks.after_pump, kill_self)
end

--- --die-at N: the controller kills itself (SIGKILL) at step N, once that step's second call (train.lua: the
-- gradient all-reduce) is on its way to the procs (--die-in step, the default), or once the procs were sent the
-- writes of step N's checkpoint (--die-in checkpoint).
function M.die_point(job, s, where)
  if job.opts["die-at"] ~= s or job.opts["die-in"] ~= where then return end
  job.out:clear()
  if where == "checkpoint" then return kill_after_pump() end
  local calls = 0
  mesh_mod.on_before_call(function()
    calls = calls + 1
    if calls == 2 then kill_after_pump() end
  end)
end

--- Before step s runs: the injections of the testing options.
function M.inject(job, s)
  local o, inj = job.opts, job.injected
  M.die_point(job, s, "step")
  if o["kill-at"] == s and not inj.kill then
    inj.kill = true
    if not job.procs.ready then job:die("--kill-at needs restart support (ProcMesh:ready)") end
    job.procs:load "faulty"
    local list = job.procs:proc_list()
    mesh_mod.flat({ list[#list] }, job.procs._libs):call_one("exit", 9) -- its future fails with the proc
    inj.killed_at, inj.killed = monarch.now(), "proc was killed"
  end
  if o["kill-host-at"] == s and not inj.kill_host then
    inj.kill_host = true
    local hosts = job.initial_hosts or {}
    if #hosts < 2 then job:die("--kill-host-at needs at least two hosts (--hosts)") end
    os.execute("kill -9 " .. hosts[#hosts].pid) -- the last host the run started with
    inj.killed_at, inj.killed = monarch.now(), "host was killed"
  end
end

--- After step s's calls returned: --fail-at fails it once, after the update moved every proc on.
function M.after_failure_injection(job, s)
  if job.opts["fail-at"] == s and not job.injected.fail then
    job.injected.fail = true
    error(errors.new { kind = "proc_failed", message = "simulated failure at step " .. s .. " (--fail-at)" }, 0)
  end
end

--- The first step after a recovery: says how long the run stood still.
function M.stepping_again(job)
  local rc = job.resume_clock
  if not rc then return end
  job:note("%s: stepping again %.3f s after the %s", rc.what, monarch.now() - rc.at, rc.since or
    job.injected.killed or "failure was reported")
  job.resume_clock, job.injected.killed_at, job.injected.killed = nil, nil, nil
end

M.snapshot_pending = function(job)
  local f = job.pending_snap
  job.pending_snap = nil
  if f then f:get() end
end

-- ---- recovery ------------------------------------------------------------------------------

local PROC_LOST = { proc_failed = true, unresponsive = true, host_lost = true }

--- Whether err comes from a proc that died. The survivors of a collective fail too ("lost the link from rank 3"),
-- and their error may be the one that arrived first; the failures of the other procs, or the mesh, tell.
function M.proc_was_lost(job, err)
  if not errors.is(err) then return false end
  if PROC_LOST[err.kind] then return true end
  for _, f in ipairs(err.failures or {}) do
    if errors.is(f) and PROC_LOST[f.kind] then return true end
  end
  if err.kind == "collective" or err.kind == "host_lost" then
    for _, p in ipairs(job.procs:proc_list()) do
      if p.state ~= "ready" then return true end
    end
  end
  return false
end

-- The script's words on a new world (how the batch and the learning rate change), after ": ".
local function world_words(job, before)
  local w = job.spec.on_world and job.spec.on_world(job, before, job:world())
  return w and (": " .. w) or ""
end

-- Moves the job onto mesh m (survivors, or a grown mesh), tensors already there.
local function move(job, m)
  job.procs, job.st.mesh = m, m
  job:bind()
end

--- After a step failed because hosts were lost: goes on with the surviving hosts from the newest snapshot.
-- Returns that step, or nil when no host of the mesh was lost.
function M.shrink(job, s)
  local survivors, dropped = job.procs:survivors()
  if dropped == 0 then return nil end
  local before = job:world()
  job.resume_clock = { what = "elastic", at = job.injected.killed_at or (job.lost_hosts[1] or {}).at or monarch.now() }
  job.lost_hosts = {}
  job.st:each(function(t) return t:on(survivors) end)
  move(job, survivors)
  local c = assert(job.st:restore())
  M.snapshot(job, c)
  job:note("elastic: %d procs lost; training goes on with %d procs on %d hosts from step %d%s", dropped,
    job:world(), job:nhosts(), c + 1, world_words(job, before))
  job:keep()
  return c
end

-- The procs restarted since the state was last whole (their tensors are new and zeroed).
local function restarted(job)
  local fresh, kept = {}, {}
  for _, p in ipairs(job.procs:proc_list()) do
    if (p.restarts or 0) ~= (job.known_restarts[p] or 0) then fresh[#fresh + 1] = p else kept[#kept + 1] = p end
  end
  return fresh, kept
end

--- Marks the state whole on every proc as it is now.
function M.whole(job)
  job.known_restarts = {}
  for _, p in ipairs(job.procs:proc_list()) do job.known_restarts[p] = p.restarts or 0 end
end

-- Puts the procs back at the newest snapshot: restarted procs get the state from a peer and their data again.
local function rewind(job, s)
  if job.st.on_gpu then
    local snap = job.host_snap
    for _, n in ipairs(job.st.names) do job.st.live[n]:put(snap.bytes[n]):get() end
    if job.spec.load then job.spec.load(job) end
    return snap.step
  end
  local fresh, kept = restarted(job)
  if #kept == 0 then
    job:die("step " .. (s + 1) .. " failed and every proc was lost: no proc holds the state (--resume goes on from "
      .. "the newest checkpoint)")
  end
  local c = assert(job.st:restore(kept))
  if #fresh > 0 then
    job.st:refill(fresh)
    if job.spec.load then job.spec.load(job) end
  end
  M.snapshot(job, c)
  M.snapshot_pending(job)
  M.whole(job)
  job.generation = job.generation + 1
  return c
end

-- Stops a controller whose job another one took over while it was unreachable: a proc refused its session
-- (procs.lua marks it taken_over), or the agents say another connected controller holds the mesh.
local function stop_if_taken_over(job, err)
  local by_proc = errors.is(err) and err.taken_over
  for _, p in ipairs(job.procs:proc_list()) do by_proc = by_proc or p.taken_over end
  if by_proc or (job.persistent and persist.held_elsewhere(job:mesh_name())) then
    job.owned = false -- its procs are the other controller's now: leave them be
    job:die(string.format("job '%s' was taken over by another controller while this one was unreachable (its host "
      .. "agents drop a controller silent for MONARCH_AGENT_SILENCE, 10 s by default); stopping here", job.name))
  end
end

-- Waits for restarted procs; a proc refused meanwhile (taken over) stops the run with its line.
local function wait_whole(job)
  job:note("recovery: waiting up to %d s for the mesh to be whole", M.READY_TIMEOUT)
  local ok, err = pcall(job.procs.ready, job.procs, M.READY_TIMEOUT)
  if not ok then
    stop_if_taken_over(job, err)
    error(err, 0)
  end
end

--- After step s failed with err: recovers and returns the step to go on from, or raises err again.
function M.failed(job, err, s)
  local failed_at = monarch.now()
  job.pending_snap = nil
  stop_if_taken_over(job, err)
  local lost = M.proc_was_lost(job, err)
  if lost and not job.st.on_gpu then
    local at = M.shrink(job, s)
    if at then return at end
  end
  local simulated = job.injected.fail and not job.injected.recovered_fail
  if not (lost and (job.procs.ready or simulated)) then
    if job.owned then pcall(job.procs.stop, job.procs) end
    error(err, 0)
  end
  job.recoveries = job.recoveries + 1
  if job.recoveries > M.MAX_RECOVERIES then
    job:die("giving up after " .. M.MAX_RECOVERIES .. " failed steps; last: " .. tostring(err))
  end
  if simulated then job.injected.recovered_fail = true end
  job:note("step %d failed: %s", s + 1, tostring(err))
  if job.procs.ready and not simulated then wait_whole(job) end
  local c = rewind(job, s)
  job:note("recovery: restored the weights of step %d; replaying %d step(s)", c, s - c)
  job.resume_clock = { what = "recovery", at = job.injected.killed_at or failed_at }
  job:keep()
  return c
end

-- ---- hosts that join ---------------------------------------------------------------------------

-- The job whose run is under way. HostMesh:on_join has no way to remove a handler, so the library adds its own
-- once per HostMesh and it tells whichever job runs now: a REPL or a notebook that runs train.run again does not
-- pile up handlers of jobs that ended (the host-loss handler is removed at the end of each run).
local current, joining = nil, setmetatable({}, { __mode = "k" })

--- The end of a job's run: its handlers stop listening.
function M.unwatch(job)
  if current == job then current = nil end
  if job.unhook_loss then job.unhook_loss() end
  job.unhook_loss = nil
end

--- Watches for lost hosts and hosts that join (once per job, before its mesh exists: a host that joins
-- before the spawn gets procs from it, and before_step leaves it be).
function M.watch(job)
  job.lost_hosts, job.joined, job.joins = {}, {}, 0
  current = job
  job.unhook_loss = monarch.on_host_loss(function(ev)
    ev.at = monarch.now()
    job.lost_hosts[#job.lost_hosts + 1] = ev
  end)
  local hosts = monarch.hosts()
  job.initial_hosts = { unpack(hosts.agents) }
  if hosts.on_join and not joining[hosts] then
    joining[hosts] = true
    hosts:on_join(function(a)
      local j = current
      if not j then return end
      j.joined[#j.joined + 1] = a
      j.joined.at = j.joined.at or monarch.now()
      j.joins = j.joins + 1
    end)
  end
end

-- The hosts that joined get procs, which receive every tensor from a healthy peer and take part from step s on.
local function grow(job, s)
  local agents, since = job.joined, job.joined.at
  job.joined = {}
  local before = job:world()
  local grown, added = job.procs:grow(agents)
  local futs = {}
  job.st:each(function(t) futs[#futs + 1] = t:copy_from_peer(grown) end)
  for _, f in ipairs(futs) do f:get() end
  move(job, grown)
  -- Sharded state (replicated only along some dimensions): each new proc takes its own replica group's shard.
  if job:replicate() then job.st:refill(added:proc_list()) end
  M.snapshot(job, s)
  M.whole(job)
  job:note("elastic: %d host(s) joined with %d procs; training goes on with %d procs on %d hosts from step %d%s",
    #agents, added:size(), job:world(), job:nhosts(), s + 1, world_words(job, before))
  job.resume_clock = { what = "elastic", at = since, since = "host joined" }
  job:keep()
end

--- Before step s: --wait-join-at, and the hosts that joined since the last step.
function M.before_step(job, s)
  local o = job.opts
  if o["wait-join-at"] == s and not job.injected.waited_join then
    job.injected.waited_join = true
    if not monarch.hosts().on_join then job:die("--wait-join-at needs join support (monarch-run --listen-joins ADDR)") end
    if job.joins == 0 then job:note("waiting for a host to join (monarch-worker --join)") end
    local deadline = monarch.now() + M.JOIN_WAIT
    while job.joins == 0 and monarch.now() < deadline do monarch.sleep(0.01) end
    if job.joins == 0 then job:die("--wait-join-at " .. s .. ": no host joined within " .. M.JOIN_WAIT .. " s") end
  end
  if #job.joined == 0 then return end
  local has = {}
  for _, p in ipairs(job.procs:proc_list()) do has[p.agent] = true end
  for i = #job.joined, 1, -1 do
    if has[job.joined[i]] then table.remove(job.joined, i) end
  end
  if #job.joined == 0 then return end
  if job.st.on_gpu then
    job.joined = {}
    return job:note("elastic: a host joined, but state on GPUs does not grow")
  end
  local ok, err = pcall(grow, job, s)
  if not ok then -- a host that went again before its procs had the state: go on without it
    job:note("elastic: a host joined but could not take part: %s", tostring(err))
    job.st:each(function(t) return t:on(job.procs) end)
  end
end

--- The end-of-run check: every replica of the state identical (CRC-32 on the procs). Returns {name = crc}.
function M.check_identical(job)
  if not job.st.on_gpu then
    local ok, r = pcall(job.st.check_identical, job.st)
    if not ok then job:die(tostring(r)) end
    return r
  end
  local out = {}
  for _, n in ipairs(job.st.names) do
    local copies = job.procs:call(job.spec.bytes_kernel, job.st.live[n]):get()
    for r = 2, copies:size() do
      if copies[r] ~= copies[1] then job:die(string.format("state '%s' differs between rank 0 and rank %d", n, r - 1)) end
    end
    out[n] = checkpoint.crc32(copies[1])
  end
  return out
end

return M
