-- tests/support/wait.lua: the one way a spec waits for something to happen.
--   local wait_for = require("support.wait").wait_for
--   wait_for(function() return p.state == "ready" end, 10, "the proc to restart")
-- A spec polls for the state it needs instead of sleeping a guessed time: it goes on as soon as that
-- state is there, and a loaded machine makes it slower, never wrong.
local ffi = require "ffi"
local monarch = require "monarch"
local runtime = require "monarch.runtime"

pcall(ffi.cdef, "int usleep(unsigned int);") -- in a pcall: another test module may have declared it

local M = {}

M.STEP = 0.02 -- seconds between two looks at pred; the controller's loop runs meanwhile

-- One step: the controller's loop where this process has one started, else a plain wait (usleep, which
-- starts no process: a spec of subprocesses alone must not use up pids).
local function step()
  if runtime.initialized then return monarch.sleep(M.STEP) end
  ffi.C.usleep(math.floor(M.STEP * 1e6))
end

--- Runs the controller's loop (if any) until pred() returns a true value; returns that value and the
-- seconds it took. After `timeout` seconds it raises, at the caller, "timed out after T s waiting
-- for WHAT" (what: a string, or a function that says it at that moment, e.g. with the state it saw).
function M.wait_for(pred, timeout, what)
  assert(type(timeout) == "number", "wait_for: a timeout in seconds")
  local t0 = monarch.now()
  while true do
    local v = pred()
    if v then return v, monarch.now() - t0 end
    if monarch.now() - t0 > timeout then
      if type(what) == "function" then what = what() end
      error(string.format("timed out after %g s waiting for %s", timeout, what or "the condition"), 2)
    end
    step()
  end
end

return M
