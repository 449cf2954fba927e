--- Proc and host-agent lifecycles: connections, failures, restarts.
-- A proc record: rank, world, host, addr, pid, port, agent, conn, state and,
-- for supervision, listeners (on_failure), restart (bool), init_hooks, libs,
-- tensors (id -> spec, to re-create after a restart) and queue (calls
-- waiting for a restart). States:
--   connecting -> ready <-> reconnecting (link lost, C layer retrying)
--   ready -> dying (socket closed or exit reported) -> dead | restarting
--   restarting -> initializing (reloading kernels, tensors, init hooks) -> ready
--   stopped (by the script)
local bulk = require "monarch.bulk"
local core = require "monarch.core"
local errors = require "monarch.errors"
local runtime = require "monarch.runtime"
local trace = require "monarch.trace"

local M = {}
local log = require "monarch.log"
local calls = require "monarch.calls"

-- Sets a proc's state, conn or in_hooks: what decides where its calls go. A mesh's targets, checked
-- once and kept for its next calls (calls.lua), are checked again after any such change.
local function set(p, field, v)
  p[field] = v
  calls.epoch = calls.epoch + 1
end
M.set = set

local MSG = core.MSG -- message types, from host/core/msg.h
M.CONNECT_TIMEOUT = 10 -- seconds to reach and authenticate a host agent
M.SPAWN_TIMEOUT = 30   -- seconds for procs to start and accept our connection
local DEATH_GRACE = 1.0 -- seconds to wait for the agent's exit report after a proc's socket closes

--- Runs the loop until pred() is true; raises a timeout MonarchError naming `what`.
function M.wait_until(pred, timeout, what)
  local deadline = runtime.now() + timeout
  while not pred() do
    if runtime.now() > deadline then
      error(errors.new { kind = "timeout", message = what .. " did not finish within " .. timeout .. "s" }, 0)
    end
    runtime.pump(0.05)
  end
end

-- ---- death -------------------------------------------------------------------------

local dying = {} -- procs whose socket closed, waiting for the agent's exit report
local restart_proc -- below

local function describe_exit(p)
  local why
  if p.exit then
    if p.exit.signal and p.exit.signal ~= "" then why = "killed by SIG" .. p.exit.signal
    else why = "exited with code " .. tostring(p.exit.status) end
  end
  if p.unresponsive then return p.unresponsive .. (why and (", then " .. why) or "") end
  return why or p.close_reason or "connection lost"
end

local function fail_event(p, kernel)
  return errors.new {
    kind = p.unresponsive and "unresponsive" or "proc_failed", rank = p.rank, host = p.host, pid = p.pid,
    cause = p.cause, kernel = kernel, taken_over = p.taken_over,
    message = "proc " .. p.cause .. (kernel and (" while running '" .. kernel .. "'") or ""),
  }
end

--- Declares p dead (or restarting): fails its calls in flight, naming the
-- one that was running, tells on_failure listeners, and restarts it when
-- its mesh asked for that.
function M.finalize_death(p)
  if p.state == "dead" or p.state == "stopped" or p.state == "restarting" then return end
  dying[p] = nil
  p.cause = p.stopping and "stopped by the script" or describe_exit(p)
  p.death_heard = nil
  local will_restart = p.restart and not p.stopping and not p.taken_over and not M.shutting_down and
    p.agent.state == "ready"
  set(p, "state", p.stopping and "stopped" or (will_restart and "restarting" or "dead"))
  local pending = core.take_pending(p.conn)
  core.disconnect(p.conn, "proc died")
  set(p, "conn", nil) -- events still queued for the old connection are stale now
  local kind = p.unresponsive and "unresponsive" or "proc_failed"
  local first_kernel
  local script_calls = 0 -- pending calls the script made (not the runtime's own, like the bulk probe)
  for i = 1, #pending, 2 do
    local id, slot = pending[i], pending[i + 1]
    local rec = runtime.call_record(id)
    if not (rec and rec.internal) then script_calls = script_calls + 1 end
    local kernel = rec and rec.kernel
    if kernel == "__actor_call" and rec.args then kernel = tostring(rec.args[1]) .. "." .. tostring(rec.args[2]) end
    first_kernel = first_kernel or kernel
    local msg = i == 1 and string.format("proc %s while running '%s'", p.cause, tostring(kernel))
      or string.format("proc %s before running this call (queued behind '%s')", p.cause, tostring(first_kernel))
    runtime.fail_slot(id, slot, errors.new {
      kind = kind, message = msg, kernel = kernel, rank = p.rank, host = p.host, pid = p.pid, cause = p.cause,
      stopped = p.stopping or nil, taken_over = p.taken_over,
    })
  end
  if p.stopping then return end
  local ev = fail_event(p, first_kernel)
  ev.restarting = will_restart
  if trace.on then
    trace.instant("proc failed", p, { cause = p.cause, kind = ev.kind, pid = p.pid, restarting = will_restart })
  end
  local handled = will_restart
  for _, fn in ipairs(p.listeners or {}) do
    handled = true
    local ok, err = pcall(fn, ev)
    if not ok then runtime.unhandled(errors.new { kind = "script", message = "on_failure handler failed: " .. tostring(err) }) end
  end
  if will_restart then
    log.log("warn", tostring(ev):gsub("^monarch: ", "") .. " (restarting)")
    restart_proc(p)
  elseif p.host_lost then
    -- Its host's one event stands for it (host_lost, below); say whether the script heard of it here.
    p.host_lost.heard = p.host_lost.heard or handled or script_calls > 0
  elseif not handled and script_calls == 0 and not M.shutting_down then
    -- Nobody was waiting on it and nobody asked to hear: stop the script rather than fail silently later.
    -- Unless a call to it fails before the pump ends: its last answer may have come in this same pump,
    -- waking a task that has not yet called it again (and will be told it is dead when it does).
    runtime.unhandled(ev, p)
  end
  -- A call queued for a restart that will not happen fails now.
  if p.state == "dead" then runtime.flush_queue(p) end
end

local function mark_dying(p, reason)
  if p.state == "dying" or p.state == "dead" or p.state == "stopped" or p.state == "restarting" then return end
  set(p, "state", "dying")
  p.closed_at = runtime.now()
  p.close_reason = p.close_reason or reason
  dying[p] = true
end

--- Sends signal sig to p through its host agent.
function M.kill(p, sig)
  if p.agent.state == "ready" then core.send(p.agent.conn, { MSG.KILL, p.pid, sig }) end
end

-- p is hung (why says how we know): kill it first, whatever happens below,
-- then let its death (and a restart) take the usual path, as unresponsive.
local function declare_hung(p, why)
  M.kill(p, 9)
  p.unresponsive = why
  mark_dying(p, why)
  core.disconnect(p.conn, why)
end

-- A proc still running a call it was asked to stop, `grace` seconds on, is hung.
table.insert(calls.hooks.on_hung, function(p, kernel, grace)
  if p.state ~= "ready" and p.state ~= "reconnecting" then return end
  declare_hung(p, string.format("hung: '%s' still running %gs after it was cancelled", kernel, grace))
end)

runtime.tick(function(now)
  for p in pairs(dying) do
    if p.exit or now - p.closed_at > DEATH_GRACE then M.finalize_death(p) end
  end
end)

-- ---- messages ----------------------------------------------------------------------

local proc_at = {}  -- conn id -> the proc it was opened for
local agent_at = {} -- conn id -> the host agent it was opened for

-- The proc whose current connection is conn. Messages on a connection the
-- proc has since replaced (a restart) are stale: nil.
local function current_proc(conn)
  local p = proc_at[conn]
  if p and p.conn == conn then return p end
end

runtime.on_message(MSG.PONG, function(m, conn)
  local p = current_proc(conn)
  if p and p.pings and p.pings[m[2]] then
    local cb = p.pings[m[2]]
    p.pings[m[2]] = nil
    cb()
  end
end)

-- Before closing, a proc or an agent says why (a refused handshake, say).
runtime.on_message(MSG.ERROR, function(m, conn)
  local p = current_proc(conn)
  if p then
    p.refused = "refused the connection: " .. tostring(m[3])
    -- Refused for good: another controller took the proc over (this one froze past its agents' patience).
    -- Its calls fail now, rather than wait on a link that is redialled and refused again; never restarted.
    if tostring(m[3]):find("^taken over by another controller") then
      p.taken_over = true
      core.disconnect(conn, p.refused)
    end
  elseif agent_at[conn] then
    agent_at[conn].reason = tostring(m[3])
  end
end)

local function on_spawn_reply(m, conn)
  local a = agent_at[conn]
  local req = a and a.requests[m[2]]
  if req then
    req.results[m[3] + 1] = m[1] == MSG.SPAWNED and { pid = m[4], port = m[5] } or { error = m[4] }
    req.count = req.count + 1
    if req.on_done and req.count == req.n then req.on_done(req) end
  end
end
runtime.on_message(MSG.SPAWNED, on_spawn_reply)
runtime.on_message(MSG.SPAWN_FAILED, on_spawn_reply)

runtime.on_message(MSG.PROC_EXIT, function(m, conn)
  local a = agent_at[conn]
  local p = a and a.procs[m[2]]
  if p then
    a.procs[m[2]] = nil
    p.exit = { status = m[3], signal = m[4] }
    if p.state == "dying" then M.finalize_death(p) else mark_dying(p, "exited") end
  end
end)

--- Seconds a proc's I/O thread may be silent before its agent reports it
-- hung (PROC_HUNG): the heartbeat timeout (monarch.configure).
M.hang_timeout = 3

-- The agent saw no status line from a proc's I/O thread for m[4] ms: the
-- proc is stopped or stuck (the agent still answers, so it is not the network).
runtime.on_message(MSG.PROC_HUNG, function(m, conn)
  local a = agent_at[conn]
  local p = a and a.procs[m[2]]
  if not p or (p.state ~= "ready" and p.state ~= "reconnecting") then return end
  declare_hung(p, string.format("unresponsive (no heartbeat from its I/O thread for %.1f s, seen by its host agent)",
    m[4] / 1000))
end)

runtime.on_message(MSG.LOG, function(m, conn)
  local a = agent_at[conn]
  if a then log.proc_output(a.hostname or a.addr, m[2], m[3], m[4]) end
end)

-- ---- proc connections ------------------------------------------------------------

-- A proc connection's events, one table for every proc (no closures per proc: a mesh of
-- thousands costs less); each finds its proc by conn. Events of a connection the proc has since
-- replaced (a restart) are stale: current_proc says nil.
local PROC_EVENTS = {
  on_connected = function(_, conn)
    local p = current_proc(conn)
    if not p then return end
    if p.state == "connecting" then
      set(p, "state", "ready")
      if trace.on then trace.proc_up(p) end -- first, so that it records every call
      bulk.probe(p) -- its first call: can it copy our memory itself?
    elseif p.state == "restarting" then
      set(p, "state", "initializing")
      if trace.on then trace.proc_up(p) end
      bulk.probe(p)
      p.on_back()
    end
  end,
  on_closed = function(reason, conn)
    local p = current_proc(conn)
    if not p then return end
    if p.state == "connecting" then
      set(p, "state", "dead")
      p.cause = "could not connect: " .. tostring(reason)
    elseif p.state == "restarting" or p.state == "initializing" then
      set(p, "state", "dead")
      p.cause = "restart failed: could not connect: " .. tostring(reason)
      runtime.flush_queue(p)
    else
      mark_dying(p, p.refused or ("connection lost: " .. tostring(reason)))
    end
  end,
  on_reconnecting = function(reason, conn)
    local p = current_proc(conn)
    if not p or p.state ~= "ready" then return end
    set(p, "state", "reconnecting")
    if trace.on then trace.instant("link lost", p, { reason = tostring(reason) }) end
    -- Silence while the agent on that host still answers: the network is
    -- fine, so the proc is hung (stopped, or stuck with its I/O thread).
    if p.agent.state == "ready" and tostring(reason):find("no heartbeat", 1, true) then
      declare_hung(p, "unresponsive (" .. tostring(reason):gsub("^connection lost: ", "") .. ")")
    end
  end,
  on_reconnected = function(_, conn)
    local p = current_proc(conn)
    if p and p.state == "reconnecting" then
      set(p, "state", "ready")
      if trace.on then trace.instant("link back", p, {}) end
    end
  end,
}

--- Iterates over every proc record with a connection now, each once (on its current one).
function M.each()
  local conn, p
  return function()
    repeat conn, p = next(proc_at, conn) until conn == nil or p.conn == conn
    return p
  end
end
trace.set_procs(M.each)

--- Connects to a spawned proc; p.state goes connecting -> ready (or dead).
-- Port 0 in SPAWNED (a simulated agent's virtual proc): no link of its own, every call a cast through
-- its agent; the connection is ready at once and costs no socket. p.pooled (a proc of a mesh of
-- cast_min procs or more): its direct link is one of a capped pool, open only while it pays.
function M.connect(p)
  local conn
  if p.port == 0 then
    conn = core.connect_relayed(p.agent.conn, p.pid)
  elseif p.pooled and p.agent and p.agent.conn and p.pid then
    conn = core.connect_pooled(p.addr, p.port, p.agent.conn, p.pid)
  else
    conn = core.connect(p.addr, p.port, "proc")
    -- Mesh-wide calls reach it through the agent that spawned it (one frame per host).
    if p.agent and p.agent.conn and p.pid then core.relay(conn, p.agent.conn, p.pid) end
  end
  set(p, "conn", conn)
  proc_at[conn] = p
  runtime.handle(conn, PROC_EVENTS)
end

-- ---- host agents -----------------------------------------------------------------

local next_req = 0
local host_loss_handlers = {}

--- fn(ev) is called once for every host lost for good, ev being a MonarchError of kind host_lost
-- with host, addr, cause and ranks (the procs lost with it, ascending).
-- Returns a function that removes fn again.
function M.on_host_loss(fn)
  if type(fn) ~= "function" then error("on_host_loss wants a function", 2) end
  host_loss_handlers[#host_loss_handlers + 1] = fn
  return function()
    for i, f in ipairs(host_loss_handlers) do
      if f == fn then table.remove(host_loss_handlers, i) return end
    end
  end
end

local function rank_list(ranks)
  local parts, i = {}, 1
  while i <= #ranks do
    local j = i
    while j < #ranks and ranks[j + 1] == ranks[j] + 1 do j = j + 1 end
    parts[#parts + 1] = j > i and (ranks[i] .. "-" .. ranks[j]) or tostring(ranks[i])
    i = j + 1
  end
  return table.concat(parts, ",")
end

-- Host agent a is gone for good, and its live procs `lost` with it: one event for the host; each
-- proc fails at once (no exit report will come), and its calls with it.
local function host_lost(a, reason, lost)
  table.sort(lost, function(x, y) return x.rank < y.rank end)
  local ranks = {}
  for i, p in ipairs(lost) do ranks[i] = p.rank end
  local ev = errors.new { kind = "host_lost", host = a.hostname or a.addr, addr = a.addr .. ":" .. a.port,
    cause = tostring(reason), ranks = ranks,
    message = string.format("host %s (%s:%d) lost: %s; %d proc%s lost with it (rank%s %s)", a.hostname or a.addr,
      a.addr, a.port, tostring(reason), #lost, #lost == 1 and "" or "s", #lost == 1 and "" or "s", rank_list(ranks)) }
  log.log("warn", tostring(ev):gsub("^monarch: ", ""))
  for _, p in ipairs(lost) do
    p.host_lost = ev
    p.close_reason = string.format("lost with its host %s:%d (%s)", a.addr, a.port, tostring(reason))
    core.disconnect(p.conn, p.close_reason)
    mark_dying(p, p.close_reason)
    M.finalize_death(p)
  end
  for _, fn in ipairs(host_loss_handlers) do
    ev.heard = true
    local ok, err = pcall(fn, ev)
    if not ok then runtime.unhandled(errors.new { kind = "script", message = "on_host_loss handler failed: " .. tostring(err) }) end
  end
  if not ev.heard then runtime.unhandled(ev) end
end

local function agent_handler(a)
  return {
    on_connected = function(info)
      a.state = "ready"
      a.hostname = info.host ~= "" and info.host or a.addr
      a.pid = info.pid
      -- What it runs, whether it takes shipped files and which ship cache it uses (monarch.ship: agents of
      -- one cache id get the bytes once); nil from an agent before shipping.
      a.ship, a.elf_class, a.elf_machine, a.cache_id = info.ship, info.elf_class, info.elf_machine, info.cache
    end,
    on_closed = function(reason)
      a.state = "dead"
      a.reason = reason
      local lost = {}
      for _, p in pairs(a.procs) do
        if p.state == "restarting" then
          set(p, "state", "dead")
          p.cause = "host agent lost while restarting: " .. tostring(reason)
          runtime.flush_queue(p)
        elseif (p.state == "ready" or p.state == "reconnecting" or p.state == "dying" or p.state == "initializing")
          and not M.shutting_down then
          if p.stopping then -- the script stopped it: not a loss
            core.disconnect(p.conn, "host agent gone")
            mark_dying(p, "host agent gone")
          else
            lost[#lost + 1] = p -- the host is gone for good: its procs with it (their own links may not have noticed)
          end
        end
      end
      if #lost > 0 then host_lost(a, reason, lost) end
    end,
    on_reconnecting = function(reason)
      a.state = "reconnecting"
      a.reason = reason
      -- The agent watches its procs and is out of reach: so are they, as far as we know.
      for _, p in pairs(a.procs) do
        if p.state == "ready" then
          set(p, "state", "reconnecting")
          p.host_away = true
        end
      end
    end,
    on_reconnected = function()
      a.state = "ready"
      for _, p in pairs(a.procs) do
        if p.host_away and p.state == "reconnecting" and p.conn and core.info(p.conn) == "ready" then set(p, "state", "ready") end
        p.host_away = nil
      end
    end,
  }
end

--- Starts connecting to a host agent; a.state goes connecting -> ready (or dead).
function M.connect_agent(a)
  a.requests, a.procs = a.requests or {}, a.procs or {}
  a.state = "connecting"
  a.conn = core.connect(a.addr, a.port, "agent")
  agent_at[a.conn] = a
  runtime.handle(a.conn, agent_handler(a))
end

--- Asks host agents for procs, one request each: asks[i] = {agent, n, base, world, on_done, device_base}
-- for n procs with ranks base..base+n-1 of `world` (device_base, optional: pin proc i to GPU
-- device_base + i). The SPAWNs go down the cast tree where its links are up (core.spawn); each agent
-- answers on its own connection. Returns the requests, in order.
function M.request_spawns(asks)
  local list, reqs = {}, {}
  for i, q in ipairs(asks) do
    next_req = next_req + 1
    local req = { id = next_req, results = {}, count = 0, n = q.n, on_done = q.on_done }
    q.agent.requests[req.id] = req
    list[i] = { q.agent.conn, req.id, { count = q.n, rank_base = q.base, world = q.world, device_base = q.device_base,
      hang_ms = math.floor(M.hang_timeout * 1000) } }
    reqs[i] = req
  end
  core.spawn(list)
  return reqs
end

--- One agent's request, as request_spawns.
function M.request_spawn(a, n, base, world, on_done, device_base)
  return M.request_spawns({ { agent = a, n = n, base = base, world = world, on_done = on_done,
    device_base = device_base } })[1]
end

--- Seconds a spawn waits for the cast tree's links to come up (an agent whose link is not up by then is
-- sent its spawn directly).
M.TREE_WAIT = 1

--- Spawns per_host procs on each of `agents` (host agents, every one ready: else a "connect" error) and
-- connects to them: the whole spawn of HostMesh:spawn_procs. opts: base and world (the procs are ranks
-- base.. of world), gpus (local proc i pinned to GPU i). Returns the proc records in rank order, every
-- one ready; or, if any could not start or connect, kills those that did and raises a "spawn" error
-- listing the others. level: where errors point, as for error().
function M.spawn(agents, per_host, opts, level)
  local base, world, gpus = opts.base, opts.world, opts.gpus
  -- A mesh that is cast to keeps direct links only while they pay (a capped pool): no socket per proc.
  local pooled = per_host * #agents >= core.cast_stats().cast_min or nil
  local asks = {}
  for h, a in ipairs(agents) do
    if a.state ~= "ready" then
      error(errors.new { kind = "connect", host = a.addr, message = "host agent is not connected" }, level + 1)
    end
    asks[h] = { agent = a, n = per_host, base = base + (h - 1) * per_host, world = world, device_base = gpus and 0 or nil }
  end
  -- Past the fan-out the spawn goes down the cast tree: its links come up first (built now if the agents
  -- changed), so that the controller writes a SPAWN per top agent, not per host.
  local wanted = core.tree_build()
  if wanted > 0 then
    pcall(M.wait_until, function() return core.cast_stats().links_up >= wanted end, M.TREE_WAIT, "tree links")
  end
  local reqs = M.request_spawns(asks)
  local procs = {}
  local ok, err = pcall(M.wait_until, function()
    for h, req in ipairs(reqs) do
      if req.count < req.n and agents[h].state == "ready" then return false end
    end
    return true
  end, M.SPAWN_TIMEOUT, "spawning procs")
  local failures = {}
  for h, a in ipairs(agents) do
    local req = reqs[h]
    -- Emptied as it is read: the wait above, hot at thousands of hosts, may have been compiled into a JIT
    -- trace that holds `reqs` as a constant, and with it every answer (5 MB at 32,768 procs).
    reqs[h] = false
    a.requests[req.id] = nil
    -- What this host's new procs share (world, host, addr), held once for all of them: a mesh of
    -- thousands of procs then costs a small table each. libs and tensors: once it has some.
    local shared = { __index = { world = world, host = a.hostname, addr = a.addr } }
    for i = 1, per_host do
      local r = req.results[i]
      local rank = base + (h - 1) * per_host + i - 1
      if r and r.port then
        local p = setmetatable({ rank = rank, pid = r.pid, port = r.port, agent = a, state = "connecting",
          device = gpus and (i - 1) or nil, pooled = pooled }, shared)
        a.procs[r.pid] = p
        M.connect(p)
        procs[rank - base + 1] = p
      else
        failures[#failures + 1] = string.format("rank %d on %s: %s", rank, a.hostname or a.addr,
          r and r.error or (a.state ~= "ready" and ("host agent lost: " .. tostring(a.reason)) or tostring(err)))
      end
    end
  end
  if #failures == 0 then
    local ok2, err2 = pcall(M.wait_until, function()
      for _, p in pairs(procs) do if p.state == "connecting" then return false end end
      return true
    end, M.SPAWN_TIMEOUT, "connecting to procs")
    for _, p in pairs(procs) do
      if p.state ~= "ready" then
        failures[#failures + 1] = string.format("rank %d on %s: %s", p.rank, p.host, p.cause or tostring(err2))
      end
    end
  end
  if #failures > 0 then
    for _, p in pairs(procs) do
      p.stopping = true
      M.kill(p, 9)
    end
    error(errors.new { kind = "spawn", message = "could not start " .. #failures .. " of " .. world ..
      " procs:\n  " .. table.concat(failures, "\n  ") }, level + 1)
  end
  return procs
end

-- ---- restarts --------------------------------------------------------------------

local lib_resolver -- monarch.ship's: the name a restarted proc loads a library by (shipped there first)

--- Called once by monarch.ship: fn(p, lib) -> the name p loads lib by after a restart.
function M.set_lib_resolver(fn) lib_resolver = fn end

--- Re-creates what a restarted proc must have before it serves the script
-- again: its kernel libraries, its tensors (zeroed), then the init hooks.
local function restore(p)
  local function call(kernel, ...)
    local rec = runtime.submit({ p }, kernel, { ... }, select("#", ...), { mode = "one", bypass = true })
    return rec.future:await()
  end
  for _, lib in ipairs(p.libs or {}) do call("__load", lib_resolver and lib_resolver(p, lib) or lib) end
  local ids = {}
  for id in pairs(p.tensors or {}) do ids[#ids + 1] = id end
  table.sort(ids)
  for _, id in ipairs(ids) do
    local spec = p.tensors[id]
    call("__tensor_new", id, spec.dtype, spec.shape)
  end
  -- The hooks use the ordinary verbs; their calls go through while others wait.
  set(p, "in_hooks", true)
  for _, fn in ipairs(p.init_hooks or {}) do fn(p) end -- each fn(p): ProcMesh:on_restart's, which makes p's mesh
  set(p, "in_hooks", false)
end

restart_proc = function(p)
  local a = p.agent
  p.restarts = (p.restarts or 0) + 1
  p.t_restart = runtime.now()
  p.exit, p.unresponsive, p.close_reason, p.refused, p.restart_error = nil, nil, nil, nil, nil
  p.on_back = function()
    runtime.spawn(function()
      local ok, err = xpcall(restore, debug.traceback, p)
      set(p, "in_hooks", false)
      if ok then
        p.cause = nil
        set(p, "state", "ready")
        p.restart_time = runtime.now() - p.t_restart
        if trace.on then
          trace.instant("proc restarted", p, { pid = p.pid, restarts = p.restarts, seconds = p.restart_time })
        end
        runtime.flush_queue(p)
      else
        set(p, "state", "dead")
        p.cause = "restart failed: " .. tostring(err)
        if trace.on then trace.instant("restart failed", p, { cause = p.cause }) end
        runtime.flush_queue(p)
        runtime.unhandled(errors.new { kind = "restart", rank = p.rank, host = p.host, message = p.cause })
      end
    end)
  end
  M.request_spawn(a, 1, p.rank, p.world, function(req)
    local r = req.results[1]
    a.requests[req.id] = nil
    if not r or not r.port then
      set(p, "state", "dead")
      p.cause = "restart failed: " .. tostring(r and r.error or "no answer from the host agent")
      runtime.flush_queue(p)
      return
    end
    p.pid, p.port = r.pid, r.port
    a.procs[r.pid] = p
    M.connect(p)
  end, p.device) -- a restarted GPU proc gets its own GPU back
end

return M
