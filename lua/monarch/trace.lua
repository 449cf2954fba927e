--- monarch.trace: the job's timeline, written as the trace-event JSON that
-- Perfetto (ui.perfetto.dev) and chrome://tracing open (docs/tracing.md).
--   monarch.trace.start("out.json")   -- or: MONARCH_TRACE=out.json monarch-run script.lua
--   ...                               -- the script runs
--   monarch.trace.stop()              -- collects every proc's spans, writes out.json
-- Each proc records its calls in a ring (host/proc/trace.c) that this module
-- drains through the __trace built-in, every M.DRAIN seconds and at stop, so
-- a proc that dies loses at most its last seconds. The controller's own
-- spans (submits, waits, tasks) and the failures and restarts of procs are
-- recorded here, by hooks in calls.lua, future.lua, tasks.lua and procs.lua
-- that cost one test of M.on while tracing is off.
local ffi = require "ffi"

local M = { on = false }

M.DRAIN = 1             -- seconds between drains of the procs' rings while tracing
M.MAX_EVENTS = 1000000  -- controller events kept; later ones are only counted
M.CLOCK_SAMPLES = 5     -- round trips per proc at stop, for its clock offset
M.STOP_TIMEOUT = 10     -- seconds stop waits for the procs' answers
M.TAKE = 16384          -- spans asked for per drain call (MN_TRACE_TAKE_MAX)

-- The controller's clock here: CLOCK_MONOTONIC, as core.now reads it, but
-- through the FFI, which the JIT compiles inline (a call into core is not).
pcall(ffi.cdef, [[
struct monarch_trace_ts { long tv_sec; long tv_nsec; };
int clock_gettime(int clk, struct monarch_trace_ts *ts);
]])
local ts = ffi.new("struct monarch_trace_ts")
local C = ffi.C
local CLOCK_MONOTONIC = 1 -- Linux

--- Seconds on the controller's monotonic clock (monarch.now's clock), cheaply: the hooks' clock.
local function now()
  C.clock_gettime(CLOCK_MONOTONIC, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end
M.now = now
local st -- the recording in progress, or nil

-- What the drains need from the modules above, handed in by them (this module is a leaf: calls.lua,
-- future.lua, tasks.lua and procs.lua call its hooks): the runtime's submit, at, pump and current_task
-- (monarch.runtime), and an iterator over the procs with a connection now (monarch.procs).
local runtime, each_proc

--- Called once by monarch.runtime: the loop the drains run on.
function M.set_runtime(r) runtime = r end

--- Called once by monarch.procs: each() iterates over every proc with a connection now.
function M.set_procs(each) each_proc = each end

local host_status -- fn(agents) -> {{agent, ok, value = STATUS}}: monarch.status.collect, handed in by monarch

--- Called once by monarch: how stop asks the hosts for what the trace says of each (its BLAS core type).
function M.set_host_status(fn) host_status = fn end

local function need_runtime(what)
  if not (runtime and each_proc) then error("monarch.trace." .. what .. ": load monarch first", 3) end
end

-- ---- the controller's events ------------------------------------------------------
-- Kept in C structs in memory of C's (calloc), CHUNK to an array, names as
-- indices into s.names: none of it is the GC's. In Lua tables a recording
-- grew the heap the GC paces itself by (a cycle per so much allocated, in
-- proportion to what is live): the garbage of each call was reused later
-- and later, from memory long out of the caches, and the GC went over every
-- event at every cycle. The controller's round trip cost 0.35 us more at
-- first, 1.3 us more once 150,000 calls were traced; now 0.3 us throughout.

pcall(ffi.cdef, "struct monarch_trace_ev { double t0, t1, arg; int32_t tid; uint32_t name; uint8_t cat; };")
pcall(ffi.cdef, "void *calloc(size_t n, size_t size);") -- each alone: one declared elsewhere fails only itself
pcall(ffi.cdef, "void free(void *p);")
local CHUNK = 8192 -- events per array (256 KiB): a new one costs little, and rarely
local ev_ptr = ffi.typeof("struct monarch_trace_ev *")
local function ev_chunk(n)
  local p = C.calloc(n, ffi.sizeof("struct monarch_trace_ev"))
  if p == nil then error("monarch.trace: out of memory for the controller's events", 0) end
  return ffi.gc(ffi.cast(ev_ptr, p), C.free)
end
local SUBMIT, WAIT, TASK = 1, 2, 3
local CATS = { "submit", "wait", "task" }

-- Event n + 1 of recording s. arg: a number (submit: the procs), or a
-- boolean (task: ok), kept as 1 or 0.
local function add(s, cat, name, t0, t1, tid, arg)
  local n = s.n
  if n >= M.MAX_EVENTS then
    s.dropped = s.dropped + 1
    return
  end
  local i = n % CHUNK
  if i == 0 then
    s.chunk = ev_chunk(CHUNK)
    s.chunks[#s.chunks + 1] = s.chunk
  end
  local id = s.ids[name]
  if not id then
    id = #s.names + 1
    s.names[id], s.ids[name] = name, id
  end
  local e = s.chunk[i]
  e.t0, e.t1, e.tid, e.name, e.cat = t0, t1, tid, id, cat
  e.arg = arg == true and 1 or tonumber(arg) or 0
  s.n = n + 1
end

--- A recording with no events yet, from t_start (start's, and trace_json's spec's); s.event(s, i)
-- reads its events (M.event: trace_json, a leaf too, reads them without requiring this module).
function M.recording(t_start)
  return { t_start = t_start, n = 0, dropped = 0, chunks = {}, names = {}, ids = {}, tasks = {}, instants = {},
    tracks = {}, event = M.event }
end

--- Adds an event to recording s: cat ("submit", "wait" or "task"), name, t0, t1, tid, arg (for trace_json's spec).
function M.add_event(s, cat, ...)
  add(s, cat == "submit" and SUBMIT or cat == "wait" and WAIT or TASK, ...)
end

--- Event i (1..s.n) of recording s: cat, name, t0, t1, tid, arg (for trace_json).
function M.event(s, i)
  local e = s.chunks[math.floor((i - 1) / CHUNK) + 1][(i - 1) % CHUNK]
  local cat = CATS[e.cat]
  local arg = e.arg
  if cat == "task" then arg = arg ~= 0 end
  return cat, s.names[e.name], e.t0, e.t1, e.tid, arg
end

-- The controller track an event belongs to: the running task's, else the script's (0).
local function tid_now()
  local t = runtime and runtime.current_task()
  return t and t.trace_tid or 0
end

--- Hook (calls.lua): a submit of `kernel` to n procs began at t0.
function M.submit(t0, kernel, n)
  if kernel == "__trace" then return end -- our own drains
  add(st, SUBMIT, kernel, t0, now(), tid_now(), n)
end

--- Hook (future.lua, tasks.lua): a wait for fut that began at t0.
function M.wait(fut, t0)
  add(st, WAIT, fut.what or "future", t0, now(), tid_now(), nil)
end

local next_task = 0

--- Hook (tasks.lua): task t (a table of tasks.lua's) was spawned to run fn.
function M.task_spawned(t, fn)
  next_task = next_task + 1
  local info = debug.getinfo(fn, "S")
  t.trace_tid = next_task
  st.tasks[next_task] = { name = string.format("task %d (%s:%d)", next_task, info.short_src, info.linedefined or 0),
    t0 = now() }
end

--- Hook (tasks.lua): task t finished (ok: without an error).
function M.task_done(t, ok)
  local rec = st.tasks[t.trace_tid]
  if not rec then return end -- spawned under an earlier recording
  rec.done = true
  add(st, TASK, rec.name, rec.t0, now(), t.trace_tid, ok)
end

--- Hook (procs.lua): something happened to proc p ("proc failed", "proc restarted", ...);
-- args: a table of details for the instant event.
function M.instant(name, p, args)
  st.instants[#st.instants + 1] = { name = name, ts = now(), rank = p.rank, agent = p.agent, args = args }
end

-- ---- the procs' spans --------------------------------------------------------------

-- A clock sample from a __trace answer: the proc read t_proc (ns) between
-- t_send and t_recv (our seconds). The one with the shortest round trip
-- gives the offset, within half that round trip.
local function sample(tr, t_send, t_recv, t_proc)
  local rtt = t_recv - t_send
  if type(t_proc) == "number" and (not tr.rtt or rtt < tr.rtt) then
    tr.rtt = rtt
    tr.offset_ns = t_proc - (t_send + t_recv) / 2 * 1e9
  end
end

-- Sends __trace(op [, n]) to the track's proc; on_done(v) gets its answer.
-- Returns the sample's handle: its t_send may be moved later, up to the
-- moment the loop writes the call (the next pump), to narrow the sample.
local function ask(tr, op, n, on_done)
  local h = { t_send = now() }
  local rec = runtime.submit({ tr.p }, "__trace", { op, n }, n and 2 or 1,
    { mode = "one", bypass = true, what = "trace " .. op })
  rec.internal = true -- the runtime's own: its failure says nothing about what the script heard
  tr.waiting = tr.waiting + 1
  rec.future:on_done(function(f)
    local t_recv = now()
    tr.waiting = tr.waiting - 1
    local ok, v = f:result()
    if not ok then
      tr.error = tostring(v)
      return
    end
    sample(tr, h.t_send, t_recv, type(v) == "table" and v[1] or v)
    if on_done then on_done(v) end
  end)
  return h
end

--- Bytes (a take's spans) copied out of the Lua heap, as {ptr, n}: kept
-- there, like the controller's events, they would slow the GC's pace more
-- and more as a recording grows.
function M.keep(bytes)
  local n = #bytes
  local p = C.calloc(n, 1)
  if p == nil then error("monarch.trace: out of memory for a proc's spans", 0) end
  ffi.copy(p, bytes, n)
  return { ptr = ffi.gc(p, C.free), n = n }
end

-- The track's proc still runs the process the track was opened for.
local function live(tr)
  local p = tr.p
  return p.pid == tr.pid and p.conn ~= nil and (p.state == "ready" or p.state == "initializing") and not tr.error
end

-- Takes up to M.TAKE of the track's spans; chain: then the rest, take after
-- take (a drain: one take a second would drop most spans of a proc answering
-- 50,000 calls a second, its ring filling faster than M.TAKE a second).
local function take(tr, chain)
  tr.taking = true
  ask(tr, "take", M.TAKE, function(v)
    tr.taking = false
    if #v[2] > 0 then tr.bins[#tr.bins + 1] = M.keep(v[2]) end
    tr.left, tr.dropped = v[3], v[4]
    if chain and tr.left > 0 and st and not st.stopping and live(tr) and tr.p.state == "ready" then take(tr, true) end
  end)
end

--- Hook (procs.lua): proc p has just connected (spawned, or restarted): it
-- records from its first call on.
function M.proc_up(p)
  local tr = { p = p, rank = p.rank, pid = p.pid, agent = p.agent, bins = {}, waiting = 0, left = 0, dropped = 0 }
  st.tracks[#st.tracks + 1] = tr
  ask(tr, "start", st.spans)
end

local function drain_tick()
  if not st then return end
  for _, tr in ipairs(st.tracks) do
    if not tr.taking and live(tr) and tr.p.state == "ready" then take(tr, true) end
  end
  st.cancel_drain = runtime.at(now() + M.DRAIN, drain_tick)
end

-- Runs the loop until every track in trs has no call of ours in flight, or
-- the deadline. spin: poll without sleeping, so that an answer is read the
-- moment it lands (the clock samples: a wake-up would lengthen the way back).
local function settle(trs, deadline, spin)
  local function busy()
    for _, tr in ipairs(trs) do
      if tr.waiting > 0 and live(tr) then return true end
    end
    return false
  end
  while busy() and now() < deadline do runtime.pump(spin and 0 or 0.01) end
end

local function live_tracks(s)
  local trs = {}
  for _, tr in ipairs(s.tracks) do
    if live(tr) then trs[#trs + 1] = tr end
  end
  return trs
end

-- Takes every span the procs of trs hold (a take returns at most M.TAKE).
local function take_all(trs, deadline)
  settle(trs, deadline) -- drains in flight first: their spans come before the rest
  local first = true
  repeat
    local more = false
    for _, tr in ipairs(trs) do
      if live(tr) and (first or tr.left > 0) then
        more = true
        take(tr)
      end
    end
    first = false
    settle(trs, deadline)
  until not more or now() >= deadline
end

-- What the trace says of each host: its procs' BLAS core type and rate (STATUS blas), for the hosts that
-- are connected at stop. A host that does not answer is only left without it.
local function hosts_blas(s)
  s.host_blas = {}
  local agents, seen = {}, {}
  for _, tr in ipairs(s.tracks) do
    local a = tr.agent
    if a and not seen[a] and a.state == "ready" then seen[a], agents[#agents + 1] = true, a end
  end
  if not host_status or #agents == 0 then return end
  local ok, replies = pcall(host_status, agents)
  if not ok then return end
  for _, r in ipairs(replies) do
    if r.ok and type(r.value) == "table" and type(r.value.blas) == "table" then s.host_blas[r.agent] = r.value.blas end
  end
end

-- At stop: every live proc stops recording, answers a few clock round trips
-- and hands over what it still holds.
local function collect(s)
  local trs, deadline = live_tracks(s), now() + M.STOP_TIMEOUT
  settle(trs, deadline) -- drains in flight first
  for _, tr in ipairs(trs) do ask(tr, "stop") end
  for _ = 1, M.CLOCK_SAMPLES do
    settle(trs, deadline, true)
    local hs = {}
    for _, tr in ipairs(trs) do if live(tr) then hs[#hs + 1] = ask(tr, "clock") end end
    local t = now() -- the calls leave at the next pump, after this
    for _, h in ipairs(hs) do h.t_send = t end
  end
  settle(trs, deadline, true)
  take_all(trs, deadline)
  hosts_blas(s)
end

--- Collects what every live proc has recorded so far, and waits for it
-- (at most timeout seconds, default STOP_TIMEOUT): those spans then survive
-- the proc's death. Drains do this every DRAIN seconds anyway.
function M.flush(timeout)
  if not st then error("monarch.trace.flush: not tracing (monarch.trace.start(path) first)", 2) end
  take_all(live_tracks(st), now() + (timeout or M.STOP_TIMEOUT))
end

-- ---- pause and resume ----------------------------------------------------------------

--- Pauses the recording: the controller records nothing more and every live
-- proc stops writing spans (what it holds is still drained) until resume().
-- Returns once the procs have answered. Tasks that end while paused show as
-- unfinished. Pausing twice is one pause.
function M.pause()
  if not st then error("monarch.trace.pause: not tracing (monarch.trace.start(path) first)", 2) end
  if st.paused then return end
  st.paused, M.on = true, false
  local trs = live_tracks(st)
  for _, tr in ipairs(trs) do ask(tr, "stop") end
  settle(trs, now() + M.STOP_TIMEOUT)
end

--- Resumes a paused recording, on every proc live now (those that connected
-- meanwhile too). Returns once the procs have answered.
function M.resume()
  if not st then error("monarch.trace.resume: not tracing (monarch.trace.start(path) first)", 2) end
  if not st.paused then return end
  st.paused, M.on = false, true
  local tracked = {}
  for _, tr in ipairs(live_tracks(st)) do
    tracked[tr.p] = true
    ask(tr, "start", st.spans)
  end
  for p in each_proc() do
    if not tracked[p] and p.conn and (p.state == "ready" or p.state == "initializing") then M.proc_up(p) end
  end
  settle(live_tracks(st), now() + M.STOP_TIMEOUT)
end

-- ---- start and stop ------------------------------------------------------------------

--- Starts tracing into the file at `path` (made now, written by stop).
-- opts.spans: the ring of each proc, in spans (default 65536, 96 bytes
-- each). Procs spawned or restarted later record from their start.
function M.start(path, opts)
  if type(path) ~= "string" or path == "" then error("monarch.trace.start wants a file path", 2) end
  if st then error("monarch.trace.start: already tracing into " .. st.path .. " (stop it first)", 2) end
  opts = opts or {}
  local spans = opts.spans
  if spans ~= nil and (type(spans) ~= "number" or spans < 1 or spans ~= math.floor(spans) or spans > 1048576) then
    error("monarch.trace.start: spans wants an integer 1..1048576 (spans per proc), got " .. tostring(spans), 2)
  end
  need_runtime("start")
  local f, err = io.open(path, "w")
  if not f then error("monarch.trace.start: cannot write the trace: " .. tostring(err), 2) end
  st = M.recording(now())
  st.path, st.file, st.spans = path, f, spans
  M.on = true
  for p in each_proc() do
    if p.conn and (p.state == "ready" or p.state == "initializing") then M.proc_up(p) end
  end
  drain_tick() -- a timer: it runs whenever the loop does
  return path
end

--- True while tracing.
function M.active() return st ~= nil end

--- Stops tracing: collects the spans of every live proc, aligns their
-- clocks with the controller's and writes the file. Returns a summary
-- {path, events, spans, procs, dropped}.
function M.stop()
  if not st then error("monarch.trace.stop: not tracing (monarch.trace.start(path) first)", 2) end
  local s = st
  M.on, s.stopping = false, true
  if s.cancel_drain then s.cancel_drain() end
  local ok, err = pcall(collect, s) -- a failing loop must not cost the trace of a failed run
  st = nil
  s.t_stop = now()
  s.collect_error = not ok and tostring(err) or nil
  local summary = require("monarch.trace_json").write(s, s.file)
  s.file:close()
  summary.path = s.path
  return summary
end

return M
