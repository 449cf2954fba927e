--- Future: the result of a call, delivered later.
--   fut:get([timeout])  blocks (running the event loop) and returns the value
--                       or raises the call's MonarchError
--   fut:await()         the same inside a task (monarch.spawn): yields instead
--   fut:done()          true once a value or error is in
--   fut:cancel()        stops the call: fails at once (kind "cancelled"); its procs stop it
local errors = require "monarch.errors"
local trace = require "monarch.trace"

local M = {}
local Future = {}
Future.__index = Future

local runtime -- set by runtime.lua, which drives the loop

function M.set_runtime(r) runtime = r end

--- Makes a pending future. `what` names it in messages ("call 'axpy'").
function M.new(what)
  return setmetatable({ state = "pending", what = what }, Future)
end

--- Resolves a pending future with a value.
function Future:resolve(v)
  if self.state ~= "pending" then return end
  self.state, self.value = "ok", v
  self:_wake()
end

--- Fails a pending future with an error.
function Future:fail(e)
  if self.state ~= "pending" then return end
  self.state, self.err = "error", e
  self:_wake()
end

function Future:_wake()
  local cbs = self._callbacks
  self._callbacks = nil
  if cbs then
    -- One failing callback must not starve the others (a waiting task among them).
    for _, cb in ipairs(cbs) do
      local ok, err = pcall(cb, self)
      if not ok then runtime.unhandled(err) end
    end
  end
end

--- Runs cb(self) once the future is done (at once if it already is).
function Future:on_done(cb)
  if self.state ~= "pending" then
    cb(self)
  else
    self._callbacks = self._callbacks or {}
    self._callbacks[#self._callbacks + 1] = cb
  end
end

function Future:done() return self.state ~= "pending" end

--- Stops the call behind this future: fails it at once with kind
-- "cancelled" and asks every proc that still holds a part of it to stop
-- (a queued part is dropped before it runs; a running kernel sees
-- mk_cancelled). Does nothing once the future is done.
function Future:cancel()
  if self.state ~= "pending" then return end
  local why = errors.new { kind = "cancelled", message = (self.what or "future") .. " cancelled" }
  if self.call then runtime.cancel_call(self.call, why) end -- a call's own future
  if self.source then self.source:cancel() end              -- a future made from another
  self:fail(why)
end

--- The future a blocking get() waits on now (the REPL cancels it on Ctrl-C).
M.waiting = nil

--- Value or error without raising: ok, value_or_error.
function Future:result()
  if self.state == "pending" then return nil, "pending" end
  self.observed = true
  if self.state == "ok" then return true, self.value end
  return false, self.err
end

local function raise(self)
  self.observed = true
  if self.state == "error" then error(self.err, 0) end
  return self.value
end

--- Waits for the value. timeout (seconds) bounds the wait, not the call:
-- a get that times out raises a "timeout" error and the call goes on.
function Future:get(timeout)
  if self.state == "pending" and runtime.in_task() then
    if not runtime.wait_for(self, timeout) then
      error(errors.new { kind = "timeout", message = string.format("%s not done after %gs (get timeout; the call continues)",
        self.what or "future", timeout) }, 2)
    end
  elseif self.state == "pending" then
    local deadline = timeout and runtime.now() + timeout
    local t0 = trace.on and trace.now()
    local outer = M.waiting
    M.waiting = self -- left set if the wait raises: what was being waited for
    while self.state == "pending" do
      local left = deadline and deadline - runtime.now()
      if left and left <= 0 then
        M.waiting = outer
        error(errors.new { kind = "timeout", message = string.format("%s not done after %gs (get timeout; the call continues)",
          self.what or "future", timeout) }, 2)
      end
      runtime.pump(left)
    end
    M.waiting = outer
    if t0 and trace.on then trace.wait(self, t0) end
  end
  return raise(self)
end

--- Inside a task: yields until done, then returns like get(). Outside: get().
function Future:await()
  if self.state == "pending" then
    if not runtime.in_task() then return self:get() end
    runtime.wait_for(self)
  end
  return raise(self)
end

Future.__tostring = function(f)
  local s = "Future(" .. (f.what or "?") .. "): " .. f.state
  if f.state == "ok" then
    local v = f.value
    s = s .. " " .. (type(v) == "table" and "<" .. (getmetatable(v) and "value" or "table") .. ">" or tostring(v))
  elseif f.state == "error" then
    s = s .. " " .. tostring(f.err)
  end
  return s
end

--- True if v is a Future.
function M.is(v) return getmetatable(v) == Future end

M.Future = Future
return M
