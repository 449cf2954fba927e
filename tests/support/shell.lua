-- tests/support/shell.lua: what specs that run programs share.
--   local shell = require "support.shell"
--   local out, rc = shell.run("build/bin/monarch-run -e 'print(1)'")  -- stdout and stderr, exit status
--   shell.quiet("kill -STOP " .. pid)                                   -- true if it exited 0
local M = {}

--- Runs cmd in sh; returns what it printed (stdout and stderr) and its exit status.
function M.run(cmd)
  local f = io.popen(cmd .. " 2>&1; echo \"::rc=$?\"")
  local out = f:read("*a")
  f:close()
  local rc = tonumber(out:match("::rc=(%d+)%s*$"))
  return (out:gsub("::rc=%d+%s*$", "")), rc
end

--- Runs cmd in sh with its output dropped; true if it exited 0.
function M.quiet(cmd) return os.execute(cmd .. " >/dev/null 2>&1") == 0 end

--- The bytes of file p (an error if it cannot be read).
function M.read(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

--- Writes s to file p.
function M.write(p, s)
  local f = assert(io.open(p, "wb"))
  f:write(s)
  f:close()
end

--- Whether file p exists.
function M.exists(p)
  local f = io.open(p, "rb")
  if f then f:close() end
  return f ~= nil
end

--- A fresh directory for a test's files, removed when the test ends: pass busted's `finally` (a spec's
-- global, which a module cannot see).
function M.scratch(finally)
  local d = os.tmpname()
  os.remove(d)
  os.execute("mkdir -p " .. d)
  finally(function() os.execute("rm -rf '" .. d .. "'") end)
  return d
end

--- Starts cmd in the background, its output (and then "::rc=N") into out_path.
function M.background(cmd, out_path)
  os.execute(("(%s > %s 2>&1; echo \"::rc=$?\" >> %s) &"):format(cmd, out_path, out_path))
end

--- The first capture of pattern in out_path, waiting up to `limit` seconds (nil: not seen).
function M.wait_output(out_path, pattern, limit)
  local wait = require "support.wait"
  local ok, got = pcall(wait.wait_for, function() return M.exists(out_path) and M.read(out_path):match(pattern) end,
    limit, pattern)
  return ok and got or nil
end

--- The whole output of a background command once it has exited, and its exit status.
function M.finished(out_path, limit)
  local rc = M.wait_output(out_path, "::rc=(%d+)", limit)
  local out = M.exists(out_path) and M.read(out_path) or ""
  return out, tonumber(rc)
end

return M
