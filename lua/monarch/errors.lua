--- Structured errors: every failure a script sees is a MonarchError.
-- Fields: kind, message, kernel, rank, host, pid, cause. tostring() gives one
-- clear line that names the proc and the kernel.
local M = {}

local MonarchError = {}
MonarchError.__index = MonarchError
MonarchError.__tostring = function(e)
  local where = {}
  if e.rank then where[#where + 1] = "rank " .. tostring(e.rank) end
  if e.host then where[#where + 1] = "host " .. tostring(e.host) end
  if type(e.pid) == "number" and e.pid > 0 then where[#where + 1] = "pid " .. string.format("%d", e.pid) end
  local s = "monarch: " .. tostring(e.kind)
  if e.kernel then s = s .. " in '" .. tostring(e.kernel) .. "'" end
  if #where > 0 then s = s .. " on " .. table.concat(where, ", ") end
  s = s .. ": " .. tostring(e.message)
  if e.others and e.others > 0 then
    s = s .. string.format(" (and %d more failure%s)", e.others, e.others == 1 and "" or "s")
  end
  return s
end

--- Makes an error object. `fields` needs at least kind and message.
function M.new(fields)
  return setmetatable(fields, MonarchError)
end

--- True if v is a MonarchError.
function M.is(v)
  return getmetatable(v) == MonarchError
end

M.MonarchError = MonarchError
return M
