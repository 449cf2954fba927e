--- Calls in flight: each kernel call the script makes is a record with one
-- slot per proc, sent through monarch.core and settled slot by slot as
-- results (or failures) arrive. Here live the policies of a call: retries
-- with backoff, re-routing (choose), queueing while a proc restarts,
-- deadlines (timeout), cancellation (and the grace a cancelled kernel gets
-- before its proc counts as hung) and backpressure (the window). The pump
-- (monarch.runtime) hands results in and runs the deadlines.
local core = require "monarch.core"
local errors = require "monarch.errors"
local future = require "monarch.future"
local tasks = require "monarch.tasks"
local trace = require "monarch.trace"

local M = {}
local unpack = unpack or table.unpack

local calls = {}          -- call id -> record
local next_call = 0
local timed = {}          -- records with a deadline

local loop -- the pump above us (monarch.runtime): its window, pump and unhandled

--- Seconds a proc may go on running a call after it was asked to stop it
-- before it counts as hung (options{cancel_grace = s} per mesh).
M.CANCEL_GRACE = 5

--- Hook lists of the modules above (they add to them; nothing here replaces their functions):
-- on_hung: fn(p, kernel, grace) for a proc that still runs `kernel`, cancelled `grace` seconds ago
-- (monarch.procs kills it).
M.hooks = { on_hung = {} }

--- Called once by monarch.runtime, which sits above the calls: submit waits
-- on its loop when a window is full, and broadcasts report failures to it.
function M.set_loop(l) loop = l end

--- The records of calls in flight, by call id. The pump reads it directly.
M.records = calls

-- The order failures are reported in: the call's timeout or cancel first, then the lowest rank.
local function failures_first(a, b)
  if (a.whole or false) ~= (b.whole or false) then return a.whole or false end
  return (a.rank or math.huge) < (b.rank or math.huge)
end

local function finish(rec)
  if rec.done then return end
  rec.done = true
  if rec.collected then core.uncollect(rec.id) end
  if rec.mode == "broadcast" then
    -- Procs the script stopped itself are not a failure worth stopping it for.
    for _, f in ipairs(rec.failures or {}) do
      if not f.stopped then
        loop.unhandled(f)
        break
      end
    end
    return
  end
  if rec.failures then
    -- Report the lowest rank first, whatever order the failures arrived in.
    table.sort(rec.failures, failures_first)
    local first = rec.failures[1]
    first.others = #rec.failures - 1
    first.failures = rec.failures
    rec.future:fail(first)
  elseif rec.mode == "one" then
    rec.future:resolve(rec.values[1])
  else
    rec.future:resolve(rec.make_result(rec.values, rec.n))
  end
end

-- Failures worth another try: the proc or its link failed, not the call itself.
local RETRYABLE = { proc_failed = true, unresponsive = true, lost = true }

local send_slot -- defined below

-- A slot of a call that already failed as a whole (its timeout) settles
-- late: its answer, or its proc's death, is dropped. The record stays in
-- `calls` until every slot has settled (so a proc's death still names the
-- kernel it was running), then goes.
local function settle_late(rec, slot)
  local p = rec.procs[slot]
  if p and p.cancel then p.cancel.ids[rec.id] = nil end
  rec.remaining = rec.remaining - 1
  if rec.remaining == 0 then calls[rec.id] = nil end
end

-- Sends slot `slot` of rec again after `delay` seconds. Its own function: a closure made in slot_done
-- would keep LuaJIT from compiling slot_done, which every answer runs.
local function retry_later(rec, slot, delay)
  tasks.at(tasks.now() + delay, function() send_slot(rec, slot) end)
end

-- Records slot `slot`'s outcome for good (its value, or its failure); the last one finishes the call.
local function settled(rec, slot, ok, v)
  if ok then
    rec.values[slot] = v
  else
    rec.failures = rec.failures or {}
    rec.failures[#rec.failures + 1] = v
  end
  if rec.on_slot then rec.on_slot(slot, ok, v) end
  rec.remaining = rec.remaining - 1
  if rec.remaining == 0 then
    calls[rec.id] = nil
    finish(rec)
  end
end

--- Settles slot `slot` of rec: ok and its value, or not ok and a
-- MonarchError. A failure of the proc may send the slot again (choose,
-- retries); the last slot to settle finishes the call.
local function slot_done(rec, slot, ok, v)
  if rec.done then return settle_late(rec, slot) end
  if not ok and RETRYABLE[v.kind] and rec.mode ~= "broadcast" then
    local tries = rec.tries[slot] or 0
    -- choose() re-routes to another live proc; retries= tries again after backoff.
    if rec.choose_from and tries < #rec.choose_from then
      for _, q in ipairs(rec.choose_from) do
        if q ~= rec.procs[slot] and (q.state == "ready" or q.state == "reconnecting") then
          rec.tries[slot] = tries + 1
          if not rec.own_procs then -- rec.procs is the caller's list until a slot is re-routed
            local own = {}
            for i, x in ipairs(rec.procs) do own[i] = x end
            rec.procs, rec.own_procs = own, true
          end
          rec.procs[slot] = q
          send_slot(rec, slot)
          return
        end
      end
    end
    if rec.retries and tries < rec.retries then
      rec.tries[slot] = tries + 1
      retry_later(rec, slot, rec.backoff * 2 ^ tries)
      return
    end
  end
  settled(rec, slot, ok, v)
end
M.slot_done = slot_done

--- Settles n slots whose values C already stored into rec.values (core.collect): the common case of
-- a mesh-wide call, without a Lua step per proc.
function M.slots_done(rec, n)
  rec.remaining = rec.remaining - n
  if rec.remaining == 0 then
    calls[rec.id] = nil
    finish(rec)
  end
end

--- Settles the run of ok results of rec that starts at entry i of ev (the
-- pump's array of fours: call id, slot, ok, value), as slot_done would each,
-- without a lookup or a call per result: a host's answers to a mesh-wide
-- call arrive together. Returns the index of the first entry after the run.
function M.ok_run(rec, ev, i, n)
  local id = rec.id
  repeat
    local slot, v = ev[i + 1], ev[i + 3]
    ev[i + 3] = nil
    if rec.done then settle_late(rec, slot) else settled(rec, slot, true, v) end
    i = i + 4
  until i > n or rec.remaining <= 0 or ev[i] ~= id or ev[i + 2] ~= true or ev[i + 1] < 0 -- settled, or a collected run
  return i
end

--- Settles slot `slot` of rec with the failure a proc sent back (c: its
-- {kind, message, kernel}, or nil).
function M.slot_failed(rec, slot, c)
  local p = rec.procs[slot]
  slot_done(rec, slot, false, errors.new {
    kind = c and c.kind or "kernel", message = c and c.message or "unknown error",
    kernel = c and c.kernel or rec.kernel, rank = p and p.rank, host = p and p.host, pid = p and p.pid,
  })
end

local function dead_error(rec, p)
  p.death_heard = true -- the caller hears of it: see runtime.unhandled
  return errors.new {
    kind = "proc_failed", kernel = rec.kernel, rank = p.rank, host = p.host, pid = p.pid, cause = p.cause,
    stopped = (p.state == "stopped" or p.stopping) or nil, -- stopped by the script, or on its way
    message = "proc is " .. p.state .. (p.cause and (" (" .. p.cause .. ")") or ""),
  }
end

-- States in which a proc takes calls now, will take them once back, or never.
local SENDABLE = { ready = true, reconnecting = true }
local COLLECT_MIN = 4 -- below this many procs, a call's answers come per slot (collecting costs a registry ref)
local CONNS_KEPT_MIN = 16 -- from this many procs, a list's conns are kept for its next call (a smaller list is often made per call)
local conns_of = setmetatable({}, { __mode = "k" }) -- procs list -> its conns, for core.call
-- Bumped whenever any proc's state, conn or in_hooks changes (procs.lua): a kept conns list whose
-- epoch is current needs no look at its procs (at tens of thousands, each a cache miss).
M.epoch = 0
local COMING_BACK = { restarting = true, initializing = true }

--- The failure of a slot that C did not queue (core.call's skipped and oom_from, core.call_as's why):
-- its proc's connection closed before the script heard of it ("closed"; the proc's death follows), or
-- the controller had no memory for it ("memory"). Nothing of it was sent.
function M.unqueued_error(kernel, p, why)
  local memory = why == "memory"
  return errors.new {
    kind = memory and "memory" or "proc_failed", kernel = kernel, rank = p and p.rank, host = p and p.host,
    pid = p and p.pid, cause = not memory and "connection closed" or nil,
    message = memory and "the controller ran out of memory queueing this call; it was not sent"
      or "proc's connection closed before the call was sent",
  }
end
local unqueued_error = M.unqueued_error

-- Fails the slots of rec that core.call did not queue: `skipped` (an array of slots, or nil) and every
-- slot from `oom_from` on (or none). core.call stops at oom_from, so every skipped slot comes before it.
local function fail_unqueued(rec, skipped, oom_from)
  for _, slot in ipairs(skipped or {}) do slot_done(rec, slot, false, unqueued_error(rec.kernel, rec.procs[slot], "closed")) end
  for slot = oom_from or rec.n + 1, rec.n do
    slot_done(rec, slot, false, unqueued_error(rec.kernel, rec.procs[slot], "memory"))
  end
end

--- Sends slot `slot` of rec to its proc (or queues it until the proc is back).
send_slot = function(rec, slot)
  if rec.done then return settle_late(rec, slot) end -- a retry or a queued slot of a call that timed out
  local p = rec.procs[slot]
  if SENDABLE[p.state] or ((rec.bypass or p.in_hooks) and p.state == "initializing") then
    local depth, why = core.call_as(rec.id, p.conn, slot, rec.kernel, unpack(rec.args, 1, rec.nargs))
    if not depth then slot_done(rec, slot, false, unqueued_error(rec.kernel, p, why)) end
  elseif COMING_BACK[p.state] or (p.state == "dying" and p.restart) then
    p.queue = p.queue or {}
    p.queue[#p.queue + 1] = { rec, slot }
  else
    slot_done(rec, slot, false, dead_error(rec, p))
  end
end

-- ---- cancellation -----------------------------------------------------------

-- A proc with cancelled calls in flight has p.cancel = {conn, ids = {[call id] = grace}}
-- and one check, every quarter grace: while its oldest call in flight (the one
-- it runs) is a cancelled one, for that call's grace, it is hung. A cancelled
-- call queued behind others is dropped by the proc when reached, so only
-- the oldest can hang. Entries go as the calls' late answers settle them.
local function check_hung(p, c, period)
  if p.conn ~= c.conn or p.cancel ~= c or next(c.ids) == nil then
    if p.cancel == c then p.cancel = nil end
    return
  end
  local now, oldest = tasks.now(), core.oldest(c.conn)
  local grace = oldest and c.ids[oldest]
  if not grace then
    c.watch = nil
  elseif c.watch ~= oldest then
    c.watch, c.since = oldest, now
  elseif now - c.since >= grace then
    p.cancel = nil
    local rec = calls[oldest]
    local hung = M.hooks.on_hung
    for i = 1, #hung do hung[i](p, rec and rec.kernel or "?", grace) end
    return
  end
  tasks.at(now + period, function() check_hung(p, c, period) end)
end

-- Asks p to stop its part of rec, and watches that it does.
local function stop_on_proc(rec, p)
  if not p.conn or core.cancel(p.conn, rec.id) == 0 or not rec.grace then return end
  local c = p.cancel
  if not c or c.conn ~= p.conn then
    c = { conn = p.conn, ids = {} }
    p.cancel = c
    local period = math.max(rec.grace / 4, 0.01)
    tasks.at(tasks.now() + period, function() check_hung(p, c, period) end)
  end
  c.ids[rec.id] = rec.grace
  if core.oldest(p.conn) == rec.id then c.watch, c.since = rec.id, tasks.now() end
end

-- Asks every proc that still holds a part of rec to stop it.
local function stop_on_procs(rec)
  if rec.n == 1 then return stop_on_proc(rec, rec.procs[1]) end
  local asked = {}
  for _, p in ipairs(rec.procs) do
    if not asked[p] then
      asked[p] = true
      stop_on_proc(rec, p)
    end
  end
end

--- Fails rec at once with err (a MonarchError: "cancelled", or its
-- timeout) and stops it on its procs. Its late answers settle it; nothing
-- of it is retried or sent again. Does nothing to a finished call.
function M.cancel(rec, err)
  if rec.done then return end
  err.whole = true
  rec.failures = rec.failures or {}
  table.insert(rec.failures, 1, err)
  finish(rec)
  stop_on_procs(rec)
end

--- Runs the loop until every proc in procs has at most half a window in flight.
function M.wait_window(procs)
  local low = loop.window / 2
  local function deep()
    for _, p in ipairs(procs) do
      if p.conn and core.inflight(p.conn) > low then return true end
    end
    return false
  end
  while deep() do loop.pump(0.01) end
end

--- Sends the calls a restarted proc missed, in the order they were made.
function M.flush_queue(p)
  local q = p.queue
  p.queue = nil
  for _, e in ipairs(q or {}) do send_slot(e[1], e[2]) end
end

--- Fails slot `slot` of call `id` with err (a MonarchError).
function M.fail_slot(id, slot, err)
  local rec = calls[id]
  if rec then slot_done(rec, slot, false, err) end
end

--- The record of a call in flight, or nil.
function M.call_record(id) return calls[id] end

--[[ Submits kernel(args) to procs (a list of proc objects).
  opts: mode ("mesh" | "one" | "broadcast"), timeout (seconds), make_result
  (values, n) -> value, on_slot(slot, ok, v), what (a name for messages),
  retries (count) and backoff (seconds, doubling) for failures of the proc
  rather than the call, choose_from (procs to re-route to), bypass (send
  to a proc that is initializing: the restore calls themselves).
  Returns the record; rec.future is the Future (nil for broadcast).
  A transaction: it raises only before anything is registered or sent (arguments that cannot be sent,
  named by their position and the kernel); after that, each slot is sent, queued or failed. ]]
function M.submit(procs, kernel, args, nargs, opts)
  local t0 = trace.on and trace.now()
  next_call = next_call + 1
  local id = next_call
  local rec = {
    id = id, kernel = kernel, n = #procs, remaining = #procs, values = {}, procs = procs, tries = {},
    mode = opts.mode or "mesh", make_result = opts.make_result, on_slot = opts.on_slot,
    args = args, nargs = nargs, retries = opts.retries, backoff = opts.backoff or 0.1,
    choose_from = opts.choose_from, bypass = opts.bypass, grace = opts.cancel_grace or M.CANCEL_GRACE,
  }
  if rec.mode ~= "broadcast" then
    rec.future = future.new(opts.what or ("call '" .. kernel .. "'"))
    rec.future.call = rec -- so that fut:cancel() reaches the call
  end
  -- The common case: every proc takes calls now; one encoding, copied to every connection.
  -- The conns list is kept per procs list and refreshed in place: no garbage per call; while no proc
  -- changed since (its epoch), it is used as it is.
  local targets, all_sendable = #procs >= CONNS_KEPT_MIN and conns_of[procs], true
  if not targets or #targets ~= #procs then
    targets = {}
    if #procs >= CONNS_KEPT_MIN then conns_of[procs] = targets end
  end
  if targets.epoch ~= M.epoch or rec.bypass then
    targets.epoch = nil
    for i, p in ipairs(procs) do
      if not SENDABLE[p.state] and not ((rec.bypass or p.in_hooks) and p.state == "initializing") then
        all_sendable = false
        break
      end
      targets[i] = p.conn
    end
    if all_sendable and not rec.bypass then targets.epoch = M.epoch end
  end
  if all_sendable and #procs > 0 then
    -- core.call raises only before it queued anything; rec is registered after it. No answer can come
    -- before the next pump, so collecting from here on misses none.
    local depth, skipped, oom_from = core.call(id, targets, kernel, unpack(args, 1, nargs))
    calls[id] = rec
    -- Successes land in rec.values from C; only failures come per slot (no on_slot to tell).
    if #procs >= COLLECT_MIN and not rec.on_slot then rec.collected = core.collect(id, rec.values) end
    if skipped or oom_from then fail_unqueued(rec, skipped, oom_from) end
    if depth > loop.window then M.wait_window(procs) end
  else
    if #procs > 0 then core.check_call(kernel, unpack(args, 1, nargs)) end -- raises before any slot goes
    calls[id] = rec
    for i = 1, #procs do send_slot(rec, i) end
  end
  if #procs == 0 then
    calls[id] = nil
    finish(rec)
  end
  if opts.timeout and not rec.done then
    rec.deadline = tasks.now() + opts.timeout
    rec.timeout = opts.timeout
    timed[#timed + 1] = rec
  end
  if t0 and trace.on then trace.submit(t0, kernel, #procs) end
  return rec
end

--- Submits a call whose bytes C queues itself: send(id) queues it to every
-- proc (slot i = procs[i]) and returns the deepest queue. For bulk transfers.
function M.submit_custom(procs, kernel, send, opts)
  opts = opts or {}
  next_call = next_call + 1
  local id = next_call
  local rec = {
    id = id, kernel = kernel, n = #procs, remaining = #procs, values = {}, procs = procs, tries = {},
    mode = "mesh", make_result = function(v) return v end, args = {}, nargs = 0, grace = M.CANCEL_GRACE,
  }
  rec.future = future.new(opts.what or ("call '" .. kernel .. "'"))
  rec.future.call = rec
  calls[id] = rec
  if #procs == 0 then
    calls[id] = nil
    finish(rec)
    return rec
  end
  local depth = send(id)
  if depth > loop.window then M.wait_window(procs) end
  return rec
end

-- ---- deadlines -------------------------------------------------------------

--- Fails every call whose timeout has passed by `now` (the pump, once per turn).
function M.check_deadlines(now)
  local keep = {}
  for _, rec in ipairs(timed) do
    if not rec.done then
      if now >= rec.deadline then
        -- Fail the whole call and stop it where it still runs; late results are dropped when they come.
        local slot
        for i = 1, rec.n do
          if rec.values[i] == nil then slot = i break end
        end
        local p = rec.procs[slot or 1]
        M.cancel(rec, errors.new {
          kind = "timeout", kernel = rec.kernel, rank = p and p.rank, host = p and p.host, pid = p and p.pid,
          message = string.format("no result within %gs (call timeout)", rec.timeout), cause = "timeout",
        })
      else
        keep[#keep + 1] = rec
      end
    end
  end
  timed = keep
end

--- The earliest deadline of a call in flight, or nil.
function M.next_deadline()
  local d
  for _, rec in ipairs(timed) do
    if not rec.done and (not d or rec.deadline < d) then d = rec.deadline end
  end
  return d
end

-- ---- counts ----------------------------------------------------------------

--- True while a call sent has not been answered (timed-out calls excepted).
function M.outstanding()
  for _, rec in pairs(calls) do
    if not rec.done then return true end
  end
  return false
end

--- Number of records in the table of calls (timed-out ones whose late answers are still due included).
function M.count()
  local n = 0
  for _ in pairs(calls) do n = n + 1 end
  return n
end

return M
