--- The controller's event loop, seen from Lua: the pump, which asks C for
-- events (core.poll), routes each to whoever handles it and runs what became
-- due. Nothing here is called by libuv. monarch.runtime is also the one face
-- of the runtime the other modules use: it re-exports the calls in flight
-- (monarch.calls) and the tasks and timers (monarch.tasks).
--   runtime.on_message(core.MSG.LOG, fn)  -- fn(msg, conn) for every LOG message
--   runtime.handle(conn, handler)         -- connection events of conn
--   runtime.pump(timeout)                 -- one turn of the loop
local core = require "monarch.core"
local future = require "monarch.future"
local calls = require "monarch.calls"
local tasks = require "monarch.tasks"
local trace = require "monarch.trace"

local R = {}

local ev = {}             -- reused by core.poll
local handlers = {}       -- conn id -> { on_connected, on_closed, on_reconnecting, on_reconnected }
local routes = {}         -- message type -> fn(msg, conn)
local unhandled = {}      -- failures nobody waits for (broadcast), raised at the next pump
local unheard = setmetatable({}, { __mode = "k" }) -- err -> the proc whose death it reports
R.initialized = false

--- Hook lists of the modules above (they add to them; nothing here replaces their functions):
-- after_pump: fn() at the end of every pump, which may raise to end the wait that pumps (the
-- REPL's Ctrl-C); agent_exit: fn(status) when the local host agent this process started exits.
R.hooks = { after_pump = {}, agent_exit = {} }
local after_pump, agent_exit = R.hooks.after_pump, R.hooks.agent_exit

--- Starts the controller core once; token is the cluster token.
function R.init(token)
  if R.initialized then return end
  core.init(token)
  R.token = token
  R.initialized = true
end

--- Most calls in flight to one proc before submit waits (backpressure):
-- memory on both ends stays bounded however many calls a script issues.
R.window = 4096 -- measured: 2.3x faster than 65536 under load, a tenth of the memory

-- ---- routing ---------------------------------------------------------------

--- Routes a connection's events to handler fields on_connected(info),
-- on_closed(reason), on_reconnecting(reason) and on_reconnected(pid); each
-- also gets conn, so one handler table can serve many connections.
-- Messages go by type instead (runtime.on_message).
function R.handle(conn, handler) handlers[conn] = handler end

--- Makes fn(msg, conn) the handler of every message of type `mtype` (a
-- core.MSG value) that arrives on any connection; msg is the decoded array
-- ({mtype, ...}). A type has one handler, the module that owns it: a
-- second one for the same type is an error, so no module can take over
-- another's messages, whatever order they are loaded in.
function R.on_message(mtype, fn)
  if type(mtype) ~= "number" or type(fn) ~= "function" then
    error("on_message wants a message type (core.MSG) and a function", 2)
  end
  if routes[mtype] then error("message type " .. mtype .. " already has a handler", 2) end
  routes[mtype] = fn
end

--- Queues a failure that nobody waits for; the next pump raises it. With
-- proc p (the failure is p's death), it is dropped instead if a call to p
-- fails first because p is dead: the script has heard of it then. A task
-- that p's last answer woke, in the same pump as p's death, does that.
function R.unhandled(err, p)
  unhandled[#unhandled + 1] = err
  if p then unheard[err] = p end
end

local records, ok_run, slots_done = calls.records, calls.ok_run, calls.slots_done

-- One entry that is not an ok result: a failed result, a message or a connection's event.
local function dispatch_one(id, a, b, c, rec)
  if id ~= 0 then
    if rec then calls.slot_failed(rec, a, c) end -- b is false: an ok one goes by ok_run
  elseif b == "message" then
    local fn = type(c) == "table" and routes[c[1]]
    if fn then fn(c, a) end
  else
    local h = handlers[a]
    if b == "connected" then
      if h and h.on_connected then h.on_connected(c, a) end
    elseif b == "closed" then
      if h and h.on_closed then h.on_closed(c, a) end
    elseif b == "reconnecting" then
      if h and h.on_reconnecting then h.on_reconnecting(c, a) end
    elseif b == "reconnected" then
      if h and h.on_reconnected then h.on_reconnected(c, a) end
    elseif b == "agent_exit" then
      for k = 1, #agent_exit do agent_exit[k](c) end
    end
  end
end

local function dispatch(n)
  local i = 1
  while i <= n do
    local id, a, b, c = ev[i], ev[i + 1], ev[i + 2], ev[i + 3]
    local rec = id ~= 0 and records[id]
    if rec and b and a < 0 then
      slots_done(rec, -a) -- -a answers C stored into rec.values itself (core.collect)
      i = i + 4
    elseif rec and b then
      i = ok_run(rec, ev, i, n) -- this result and the ones of the same call right after it
    else
      ev[i + 3] = nil
      dispatch_one(id, a, b, c, rec)
      i = i + 4
    end
  end
end

-- ---- the pump --------------------------------------------------------------

--- Waits up to `timeout` seconds (nil: until something happens) for events,
-- handles them, runs ready tasks, and raises any unhandled failure.
function R.pump(timeout)
  local wait = timeout
  local d = tasks.next_timer(calls.next_deadline())
  local now = tasks.now()
  if d and (not wait or d - now < wait) then wait = math.max(0, d - now) end
  if tasks.any_ready() then wait = 0 end
  if not wait or wait > 0.25 then wait = 0.25 end -- supervisors tick at least 4 times a second
  local n = core.poll(ev, math.floor(wait * 1000 + 0.5))
  dispatch(n)
  now = tasks.now()
  tasks.run_tickers(now)
  tasks.run_timers(now)
  calls.check_deadlines(now)
  tasks.run_ready()
  while #unhandled > 0 do
    local e = table.remove(unhandled, 1)
    local p = unheard[e]
    unheard[e] = nil
    if not (p and p.death_heard) then error(e, 0) end
  end
  for i = 1, #after_pump do after_pump[i]() end
end

--- Runs the loop until every task has finished and every call sent has
-- been answered (broadcasts included: no work is dropped at exit); raises
-- the first failure nobody observed.
function R.drain_tasks()
  while tasks.live() > 0 or calls.outstanding() do R.pump(nil) end
  tasks.raise_unobserved()
end

--- Counts, for progress and tests: calls_in_flight (records in the table of
-- calls) and tasks (not finished).
function R.stats()
  return { calls_in_flight = calls.count(), tasks = tasks.live() }
end

-- ---- the rest of the runtime, from its parts ---------------------------------

-- Tasks and timers (monarch.tasks).
R.now, R.in_task, R.spawn, R.wait_for = tasks.now, tasks.in_task, tasks.spawn, tasks.wait_for
R.at, R.tick, R.current_task = tasks.at, tasks.tick, tasks.current
-- Calls in flight (monarch.calls).
R.submit, R.submit_custom, R.wait_window = calls.submit, calls.submit_custom, calls.wait_window
R.flush_queue, R.fail_slot, R.call_record, R.cancel_call = calls.flush_queue, calls.fail_slot, calls.call_record, calls.cancel
R.unqueued_error = calls.unqueued_error

calls.set_loop(R)
future.set_runtime(R)
trace.set_runtime(R)
return R
