-- A pseudo-terminal driver for tests: runs a program on a new terminal and
-- talks to it like a user at the keyboard (LuaJIT FFI, forkpty).
--   local pty = require "support.pty"
--   local t = pty.spawn({ "build/bin/monarch-run", "-i" }, { HOME = dir })
--   t:send("1 + 1\n")
--   t:expect("\n2\n")          -- a plain-text pattern; escape sequences and \r removed
--   t:close()
local ffi = require "ffi"

local CDEFS = {
  "struct mn_pty_winsize { unsigned short ws_row, ws_col, ws_xpixel, ws_ypixel; };",
  "int forkpty(int *amaster, char *name, const void *termp, const struct mn_pty_winsize *winp);",
  "int execve(const char *path, char *const argv[], char *const envp[]);",
  "void _exit(int status);",
  "long read(int fd, void *buf, size_t n);",
  "long write(int fd, const void *buf, size_t n);",
  "int close(int fd);",
  "struct pollfd { int fd; short events; short revents; };",
  "int poll(struct pollfd *fds, unsigned long nfds, int timeout);",
  "int kill(int pid, int sig);",
  "void *signal(int sig, void *handler);",
  "int waitpid(int pid, int *status, int options);",
  "extern char **environ;",
  "struct mn_pty_termios { unsigned int c_iflag, c_oflag, c_cflag, c_lflag; unsigned char c_line, c_cc[32]; unsigned int c_ispeed, c_ospeed; };",
  "int tcgetattr(int fd, struct mn_pty_termios *t);",
}
for _, d in ipairs(CDEFS) do pcall(ffi.cdef, d) end -- some may be declared by other test modules
local C = ffi.C

local M = {}
local SIGKILL, SIGTERM, WNOHANG, POLLIN, ICANON = 9, 15, 1, 1, 2
local EXPECT_TIMEOUT = 10 -- seconds expect() waits by default

local Term = {}
Term.__index = Term

-- NULL-terminated char*[] from a Lua list, with the strings kept alive in `keep`.
local function cstrings(list, keep)
  local arr = ffi.new("char *[?]", #list + 1)
  for i, s in ipairs(list) do
    local buf = ffi.new("char[?]", #s + 1, s)
    keep[#keep + 1] = buf
    arr[i - 1] = buf
  end
  arr[#list] = nil
  keep[#keep + 1] = arr
  return arr
end

--- Starts argv[1] with arguments argv on a new pseudo-terminal, with this
-- process's environment plus `env` (a value of false removes a variable).
function M.spawn(argv, env)
  local vars, order = {}, {}
  local i = 0
  while C.environ[i] ~= nil do
    local kv = ffi.string(C.environ[i])
    local k = kv:match("^([^=]*)=")
    if k and vars[k] == nil then
      order[#order + 1] = k
      vars[k] = kv:sub(#k + 2)
    end
    i = i + 1
  end
  for k, v in pairs(env or {}) do
    if vars[k] == nil then order[#order + 1] = k end
    vars[k] = v
  end
  local envl = {}
  for _, k in ipairs(order) do
    if vars[k] then envl[#envl + 1] = k .. "=" .. vars[k] end
  end
  local keep = {}
  local cargv, cenv = cstrings(argv, keep), cstrings(envl, keep)
  local path = keep[1]
  local ws = ffi.new("struct mn_pty_winsize", { 50, 200, 0, 0 })
  local master = ffi.new("int[1]")
  -- The child does nothing but exec: everything it needs was built above. SIGINT and SIGQUIT as a login
  -- shell gives them (a test run in the background inherits them ignored: Ctrl-C would test nothing).
  local pid = C.forkpty(master, nil, nil, ws)
  if pid == 0 then
    C.signal(2, nil)
    C.signal(3, nil)
    C.execve(path, cargv, cenv)
    C._exit(127)
  end
  if pid < 0 then error("forkpty failed: errno " .. ffi.errno()) end
  return setmetatable({ pid = pid, fd = master[0], out = "", pos = 1 }, Term)
end

-- Without terminal escape sequences and carriage returns.
local function plain(s)
  s = s:gsub("\27%[[%d;?]*[%a@]", ""):gsub("\27[%(%)][%w]", ""):gsub("\27[=>]", "")
  return (s:gsub("\r", ""))
end
M.plain = plain

local now = require("monarch.core").now
local runtime = require "monarch.runtime"

--- Sleeps s seconds. The test process's own monarch runtime (shared by every
-- spec) keeps turning meanwhile: a controller that stops answering its
-- heartbeats loses its host agent.
function M.sleep(s)
  local t0 = now()
  while now() - t0 < s do
    if runtime.initialized then runtime.pump(0.01) else require("monarch.core").sleep(0.01) end
  end
end

--- Reads what the program writes for up to `timeout` seconds, stopping
-- early once `until_fn(text)` is true for the plain text not yet expected.
-- Returns false once the terminal is closed.
function Term:pump(timeout, until_fn)
  local t0 = now()
  local buf = ffi.new("char[65536]")
  local pfd = ffi.new("struct pollfd[1]")
  pfd[0].fd, pfd[0].events = self.fd, POLLIN
  while true do
    local left = timeout - (now() - t0)
    if left <= 0 then return true end
    if runtime.initialized then runtime.pump(0) end
    local r = C.poll(pfd, 1, math.max(1, math.floor(math.min(left, 0.01) * 1000)))
    if r > 0 then
      local n = C.read(self.fd, buf, 65536)
      if n <= 0 then return false end -- EIO: the program and its terminal are gone
      self.out = self.out .. ffi.string(buf, n)
      if until_fn and until_fn(plain(self.out):sub(self.pos)) then return true end
    end
  end
end

--- Types s (any bytes: "\t" is Tab, "\3" Ctrl-C, "\4" Ctrl-D).
function Term:send(s)
  local n = C.write(self.fd, s, #s)
  assert(n == #s, "write to the terminal failed")
end

--- Waits until the program reads the terminal key by key (a line editor
-- has switched canonical mode off): what is typed from then on reaches it
-- as typed. (libedit shows its prompt a moment before that; a Ctrl-D typed
-- in between is the terminal's end-of-file, not a key.) Returns whether it did.
function Term:ready(timeout)
  local tio = ffi.new("struct mn_pty_termios")
  local t0 = now()
  repeat
    if C.tcgetattr(self.fd, tio) == 0 and bit.band(tio.c_lflag, ICANON) == 0 then return true end
    self:pump(0.005)
  until now() - t0 > (timeout or 2)
  return false
end

--- Waits for `what` (plain text; a Lua pattern if is_pattern) in the output
-- since the last expect, without escape sequences and carriage returns.
-- Returns the text up to and including it; raises with what did arrive
-- after `timeout` seconds.
function Term:expect(what, timeout, is_pattern)
  local found
  local function look(text)
    local _, e = text:find(what, 1, not is_pattern)
    found = e
    return e ~= nil
  end
  if not look(plain(self.out):sub(self.pos)) then self:pump(timeout or EXPECT_TIMEOUT, look) end
  local text = plain(self.out):sub(self.pos)
  if not found then error(string.format("expected %q on the terminal; got:\n%s", what, text), 2) end
  self.pos = self.pos + found
  return text:sub(1, found)
end

--- The plain text that arrived since the last expect (after reading for `timeout` seconds).
function Term:rest(timeout)
  if timeout then self:pump(timeout) end
  return plain(self.out):sub(self.pos)
end

--- Waits up to timeout seconds for the program to exit; returns its exit code (or nil).
function Term:wait(timeout)
  local st = ffi.new("int[1]")
  local t0 = now()
  repeat
    self:pump(0.05)
    local r = C.waitpid(self.pid, st, WNOHANG)
    if r == self.pid then
      self.exited = true
      local s = st[0]
      if bit.band(s, 0x7f) == 0 then return bit.rshift(bit.band(s, 0xff00), 8) end
      return 128 + bit.band(s, 0x7f)
    end
  until now() - t0 > timeout
  return nil
end

--- Ends the program if it still runs, and closes the terminal.
function Term:close()
  if not self.exited then
    C.kill(self.pid, SIGTERM)
    if not self:wait(2) then
      C.kill(self.pid, SIGKILL)
      self:wait(2)
    end
  end
  if self.fd >= 0 then
    C.close(self.fd)
    self.fd = -1
  end
end

return M
