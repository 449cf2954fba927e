-- tests/procstat.lua: what the specs ask of a process by its pid.
local M = {}

--- True while pid runs (a zombie waiting for its parent to reap it does not count).
function M.alive(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return false end
  local st = f:read("*a"):match("%) (%a)")
  f:close()
  return st ~= nil and st ~= "Z"
end

return M
