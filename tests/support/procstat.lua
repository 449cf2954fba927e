-- tests/support/procstat.lua: what the specs ask of a process by its pid.
local M = {}

--- True while pid runs (a zombie waiting for its parent to reap it does not count).
function M.alive(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return false end
  local st = f:read("*a"):match("%) (%a)")
  f:close()
  return st ~= nil and st ~= "Z"
end

--- The CPU time pid has used, user and system, in clock ticks (1/100 s on Linux); nil once it is gone.
function M.cpu_ticks(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return nil end
  local fields = {}
  for w in f:read("*a"):match("%) (.*)"):gmatch("%S+") do fields[#fields + 1] = w end
  f:close()
  return tonumber(fields[12]) + tonumber(fields[13]) -- utime and stime: fields 14 and 15 of proc(5)
end

--- pid's environment as /proc gives it: NUL-separated NAME=value entries.
function M.environ(pid)
  local f = assert(io.open("/proc/" .. pid .. "/environ", "rb"))
  local e = f:read("*a")
  f:close()
  return e
end

return M
