--- Tasks and timers: coroutines the loop resumes (monarch.spawn), one-shot
-- timers (runtime.at) and tickers run on every pump (proc supervision).
-- Nothing here waits: the pump (monarch.runtime) asks what is due and runs it.
local core = require "monarch.core"
local errors = require "monarch.errors"
local future = require "monarch.future"
local trace = require "monarch.trace"

local M = {}
local unpack = unpack or table.unpack

local ready = {}          -- tasks to resume: { co, ... }
local current = nil       -- the task running now
local tasks = {}          -- every task's future, for the end of the script
local live_tasks = 0
local task_of = setmetatable({}, { __mode = "k" }) -- coroutine -> task
local tickers = {}        -- functions run on every pump (proc supervision)
local timers = {}         -- { at = seconds, fn = function } run by the pump when due

--- Seconds on the controller's monotonic clock.
function M.now() return core.now() end

--- The task running now (the table spawn made), or nil outside tasks.
function M.current() return current and task_of[current] end

--- True when called from inside a task (a coroutine the loop resumes).
function M.in_task() return current ~= nil and coroutine.running() == current end

-- ---- timers and tickers ----------------------------------------------------

--- Adds fn(now) to what every pump runs; returns a function that removes it.
function M.tick(fn)
  tickers[fn] = true
  return function() tickers[fn] = nil end
end

--- Runs every ticker (the pump, once per turn).
function M.run_tickers(now)
  for fn in pairs(tickers) do fn(now) end
end

--- Runs fn() once, at `at` seconds (runtime.now() clock); pump wakes for it.
-- Returns a function that cancels it.
function M.at(at, fn)
  local t = { at = at, fn = fn }
  timers[t] = true
  return function() timers[t] = nil end
end

--- Runs the timers due by `now`, earliest first.
function M.run_timers(now)
  local due
  for t in pairs(timers) do
    if t.at <= now then
      due = due or {}
      due[#due + 1] = t
    end
  end
  if due then
    table.sort(due, function(a, b) return a.at < b.at end)
    for _, t in ipairs(due) do
      timers[t] = nil
      t.fn()
    end
  end
end

--- The earliest time a timer is due at, or `d` if that is earlier (nil: no timer, no d).
function M.next_timer(d)
  for t in pairs(timers) do
    if not d or t.at < d then d = t.at end
  end
  return d
end

-- ---- tasks -----------------------------------------------------------------

local function run_task(t)
  local prev = current
  current = t.co
  local ok, a, b = coroutine.resume(t.co, unpack(t.args or {}, 1, t.nargs or 0))
  t.args = nil
  current = prev
  if coroutine.status(t.co) == "dead" then
    live_tasks = live_tasks - 1
    if trace.on and t.trace_tid then trace.task_done(t, ok and a) end
    if not ok then
      t.future:fail(a)
    elseif a then
      t.future:resolve(b)
    else
      t.future:fail(b)
    end
  end
end

local function traceback(e)
  if errors.is(e) then return e end
  return debug.traceback(tostring(e), 2)
end

--- Runs fn(...) as a task (a coroutine the loop resumes); returns its Future.
function M.spawn(fn, ...)
  if type(fn) ~= "function" then error("monarch.spawn wants a function, got " .. type(fn), 2) end
  local f = future.new("task")
  local co = coroutine.create(function(...) return xpcall(fn, traceback, ...) end)
  local t = { co = co, future = f, args = { ... }, nargs = select("#", ...) }
  task_of[co] = t
  if trace.on then trace.task_spawned(t, fn) end
  live_tasks = live_tasks + 1
  tasks[#tasks + 1] = f
  ready[#ready + 1] = t
  return f
end

--- Suspends the running task until fut is done, or until `timeout`
-- seconds pass (then returns false with fut still pending).
function M.wait_for(fut, timeout)
  local t = task_of[coroutine.running()]
  local woken = false
  local function wake()
    if not woken then
      woken = true
      ready[#ready + 1] = t
    end
  end
  local cancel = timeout and M.at(M.now() + timeout, wake)
  local t0 = trace.on and trace.now()
  fut:on_done(wake)
  coroutine.yield()
  if t0 and trace.on then trace.wait(fut, t0) end
  if cancel then cancel() end
  return fut.state ~= "pending"
end

--- True if a task is waiting to be resumed (the pump then does not block).
function M.any_ready() return #ready > 0 end

--- Resumes every task that is ready, and those they make ready, until none is.
function M.run_ready()
  while #ready > 0 do
    local batch = ready
    ready = {}
    for _, t in ipairs(batch) do run_task(t) end
  end
end

--- Number of tasks not finished yet.
function M.live() return live_tasks end

--- Raises the first failure of a finished task that nobody observed, then
-- forgets the tasks (the end of the script: monarch.shutdown).
function M.raise_unobserved()
  for _, f in ipairs(tasks) do
    if f.state == "error" and not f.observed then
      f.observed = true
      error(f.err, 0)
    end
  end
  tasks = {}
end

return M
