-- Hardening: a proc's port attacked with raw sockets (the agent's is in
-- auth_spec.lua), what monarch-worker refuses to start with, and bounded
-- memory when a script issues calls without waiting for them.
local monarch = require "monarch"
local core = require "monarch.core"
local runtime = require "monarch.runtime"
local raw = require "support.rawpeer"

local B = os.getenv("MONARCH_BUILD") or "build"
local WORKER = B .. "/bin/monarch-worker"

local function sh(cmd) return os.execute(cmd) == 0 end

local function slurp(path)
  local f = io.open(path)
  if not f then return "" end
  local s = f:read("*a")
  f:close()
  return s
end

--- A field of /proc/<pid>/status in KiB ("VmRSS", "VmPeak"...), or nil.
local function status_kb(pid, field)
  return tonumber(slurp("/proc/" .. pid .. "/status"):match(field .. ":%s*(%d+)"))
end

local function alive(pid) return sh("kill -0 " .. pid .. " 2>/dev/null") end

-- Under ASan (make test-asan) freed memory sits in a quarantine of up to
-- 256 MiB, so a worker's RSS says nothing about leaks there.
local ASAN = sh("ldd " .. WORKER .. " 2>/dev/null | grep -q libasan")

-- A proc reports its port on --port-fd, a socket when its agent starts it;
-- the test does the same: it listens, and bash's /dev/tcp connects the
-- proc's fd 3 to it.
local ffi = require "ffi"
pcall(ffi.cdef, [[
  int bind(int, const void *, uint32_t);
  int listen(int, int);
  int accept(int, void *, void *);
  int getsockname(int, void *, uint32_t *);
]])
local C = ffi.C

--- Listens on 127.0.0.1:0; returns the fd and the port.
local function listener()
  local fd = C.socket(2, 1, 0)
  local sa = ffi.new("struct sockaddr_in")
  sa.sin_family = 2
  C.inet_pton(2, "127.0.0.1", ffi.cast("char *", sa) + 4)
  assert(C.bind(fd, sa, ffi.sizeof(sa)) == 0 and C.listen(fd, 1) == 0, "listen failed")
  local len = ffi.new("uint32_t[1]", ffi.sizeof(sa))
  assert(C.getsockname(fd, sa, len) == 0)
  return fd, bit.bor(bit.lshift(bit.band(sa.sin_port, 0xff), 8), bit.rshift(sa.sin_port, 8))
end

--- Reads a frame from a raw peer within secs, running the controller's loop
-- meanwhile so that its agents' heartbeats go on during a long wait.
local function frame_pumping(p, secs)
  local deadline = runtime.now() + secs
  while runtime.now() < deadline do
    local body, why = p:read_frame(0)
    if body or why == "closed" then return body, why end
    runtime.pump(0.05)
  end
  return nil, "timeout"
end

--- Waits up to `secs` for fd to be readable.
local function readable(fd, secs)
  local pfd = ffi.new("struct pollfd", { fd = fd, events = 1 })
  return C.poll(pfd, 1, secs * 1000) == 1
end

-- ---- the few messages these tests write by hand ------------------------------

local function fixstr(s) return string.char(0xa0 + #s) .. s end
--- [SESSION, sid, 0] with a small session id.
local function session(sid) return raw.frame("\x93\x16" .. string.char(sid) .. "\x00") end
--- [CALL, seq, kernel, args] where args is already encoded as a msgpack array.
local function call(seq, kernel, args) return raw.frame("\x94\x14" .. string.char(seq) .. fixstr(kernel) .. args) end
--- True if body is [RESULT, seq, true, ...].
local function result_ok(body, seq) return body and body:sub(1, 4) == "\x94\x15" .. string.char(seq) .. "\xc3" end

describe("a proc's port attacked with raw sockets", function()
  local token, port, pid, log

  local port_conn

  setup(function()
    monarch.hosts() -- starts the runtime, so its token is known
    token = runtime.token
    log = os.tmpname()
    local pidfile = os.tmpname()
    local lfd, lport = listener()
    -- A proc of its own (not one a controller holds): an authenticated raw
    -- peer replaces the proc's controller, which would disturb a real mesh.
    assert(sh(string.format("bash -c 'exec 3<>/dev/tcp/127.0.0.1/%d; MONARCH_TOKEN=%s exec %s --proc --rank 0 " ..
      "--world 1 --bind 127.0.0.1 --orphan-timeout 120 --port-fd 3' >%s 2>&1 & echo $! >%s",
      lport, token, WORKER, log, pidfile)))
    pid = tonumber(slurp(pidfile))
    os.remove(pidfile)
    assert(readable(lfd, 10), "the proc did not connect its port fd: " .. slurp(log))
    port_conn = C.accept(lfd, nil, nil)
    C.close(lfd)
    local buf = ffi.new("char[64]")
    local line = ""
    while not line:find("\n") and readable(port_conn, 10) do
      local n = tonumber(C.recv(port_conn, buf, 64, 0))
      if n <= 0 then break end
      line = line .. ffi.string(buf, n)
    end
    port = tonumber(line:match("^(%d+)\n"))
    assert.is_number(port, "proc did not report its port: " .. line .. slurp(log))
  end)

  teardown(function()
    if pid then sh("kill -9 " .. pid .. " 2>/dev/null") end
    if port_conn then C.close(port_conn) end
    os.remove(log)
  end)

  local function hello()
    local p = raw.connect(port)
    local body = assert(p:read_frame(2))
    return p, raw.hello_nonce(body)
  end

  --- An authenticated connection: HELLO, AUTH, WELCOME read.
  local function authed()
    local p, nonce = hello()
    p:send(raw.auth_frame(token, nonce))
    assert.are.equal(3, p:read_frame(2):byte(2)) -- WELCOME
    return p
  end

  it("greets with HELLO and rejects a wrong token before anything else", function()
    local p, nonce = hello()
    p:send(raw.auth_frame("not the token", nonce))
    assert.matches("authentication failed: wrong cluster token", raw.error_message(p:read_frame(2)))
    assert.is_true(p:closed(2))
  end)

  it("refuses a CALL sent in place of AUTH, and does not run it", function()
    local p = hello()
    -- __tensor_new(77, "f32", {4}): if it ran, __info would count a tensor below.
    p:send(call(1, "__tensor_new", "\x93\x4d\xa3f32\x91\x04"))
    assert.matches("expected AUTH as the first message", raw.error_message(p:read_frame(2)))
    assert.is_true(p:closed(2))
  end)

  it("refuses an AUTH replayed from an earlier connection", function()
    local p1, n1 = hello()
    local auth = raw.auth_frame(token, n1)
    p1:send(auth)
    assert.are.equal(3, p1:read_frame(2):byte(2))
    p1:close()
    local p2 = hello()
    p2:send(auth)
    assert.matches("authentication failed", raw.error_message(p2:read_frame(2)))
    assert.is_true(p2:closed(2))
  end)

  it("answers an oversized length prefix with an ERROR naming it", function()
    local p = hello()
    p:send("GET / HTTP/1.1\r\n\r\n")
    assert.matches("handshake frame too large", raw.error_message(p:read_frame(2)))
    assert.is_true(p:closed(2))
  end)

  it("drops a peer that trickles its AUTH a byte a second, and one that says nothing, 5 s after they came", function()
    local trickler, silent = hello(), hello()
    local t0 = runtime.now()
    trickler:send("\0\0\0\40")
    local body, why
    -- MN_HANDSHAKE_TIMEOUT_MS (5 s) counts from accept, not from the last byte.
    while runtime.now() - t0 < 8 do
      trickler:send("\x94")
      body, why = frame_pumping(trickler, 1)
      if body or why == "closed" then break end
    end
    assert.matches("handshake not completed in time", raw.error_message(body))
    assert.is_true(runtime.now() - t0 < 6.5, string.format("dropped after %.1f s", runtime.now() - t0))
    assert.matches("handshake not completed in time", raw.error_message(silent:read_frame(2)))
    assert.is_true(trickler:closed(2))
    assert.is_true(silent:closed(2))
  end)

  it("refuses tiny frames announcing huge arrays without reserving memory for them", function()
    local before = status_kb(pid, "VmPeak")
    -- 2^26 and 2^31 elements in 5-byte bodies: msgpack-c reserves 24 bytes an
    -- element from the header alone unless the count is checked first.
    for _, body in ipairs { "\xdd\x04\x00\x00\x00", "\xdd\x7f\xff\xff\xff" } do
      local p = hello()
      p:send(raw.frame(body))
      assert.is_string(raw.error_message(p:read_frame(3)))
      assert.is_true(p:closed(2))
    end
    assert.is_true(alive(pid), "the proc died")
    local grown = (status_kb(pid, "VmPeak") - before) / 1024
    assert.is_true(grown < 256, string.format("VmPeak grew by %.0f MiB", grown))
  end)

  it("holds at most 16 handshakes at once (MN_MAX_HANDSHAKES) and takes new ones when they end", function()
    local held = {}
    for i = 1, 16 do held[i] = hello() end
    local extra = raw.connect(port)
    local body, why = extra:read_frame(2)
    assert.is_nil(body)
    assert.are.equal("closed", why)
    for _, p in ipairs(held) do p:close() end
    os.execute("sleep 0.3")
    local p = hello()
    p:close()
  end)

  it("wants SESSION as the first message after WELCOME", function()
    local p = authed()
    p:send(call(1, "noop", "\x90"))
    assert.matches("expected SESSION as the first message after WELCOME", raw.error_message(p:read_frame(2)))
    assert.is_true(p:closed(2))
  end)

  it("answers malformed msgpack after authentication with an ERROR and closes", function()
    local p = authed()
    p:send(session(11) .. raw.frame("\xc1\xc1\xc1"))
    assert.matches("not valid msgpack", raw.error_message(p:read_frame(2)))
    assert.is_true(p:closed(2))
  end)

  it("answers a gap in CALL sequence numbers with an ERROR and closes", function()
    local p = authed()
    p:send(session(12) .. call(5, "noop", "\x90"))
    assert.matches("CALL sequence gap: got 5 after 0", raw.error_message(p:read_frame(2)))
    assert.is_true(p:closed(2))
  end)

  it("still runs calls for a peer holding the token after all of that, with no tensor left behind", function()
    local p = authed()
    p:send(session(13) .. call(1, "__load", "\x91" .. fixstr "basic") .. call(2, "echo", "\x91" .. fixstr "hi") ..
      call(3, "__info", "\x90"))
    assert.is_true(result_ok(p:read_frame(2), 1))
    assert.are.equal("\x94\x15\x02\xc3\x91\xa2hi", p:read_frame(2))
    local info = p:read_frame(2)
    assert.is_true(result_ok(info, 3))
    -- __info ends with (tensors, tensor bytes): the CALL refused before AUTH created nothing.
    assert.are.equal("\x00\x00", info:sub(-2))
    p:close()
    assert.is_true(alive(pid))
  end)
end)

describe("monarch-worker without a cluster token", function()
  --- Runs monarch-worker with args and no token; returns its exit code and output.
  local function run(env, args)
    local out, rcf = os.tmpname(), os.tmpname()
    -- timeout: a worker that starts anyway would otherwise listen forever (exit 124).
    os.execute(string.format("env -u MONARCH_TOKEN -u MONARCH_TOKEN_FILE %s timeout 5 %s %s >%s 2>&1; echo $? >%s",
      env, WORKER, args, out, rcf))
    local code, s = tonumber(slurp(rcf)), slurp(out)
    os.remove(out)
    os.remove(rcf)
    return code, s
  end

  it("refuses --listen 0.0.0.0:0, saying which variables to set", function()
    local code, out = run("", "--listen 0.0.0.0:0")
    assert.are.equal(2, code)
    assert.matches("no cluster token: set MONARCH_TOKEN or MONARCH_TOKEN_FILE", out)
    assert.not_matches("listening", out)
  end)

  it("treats an empty MONARCH_TOKEN as none", function()
    local code, out = run("MONARCH_TOKEN=", "--listen 0.0.0.0:0")
    assert.are.equal(2, code)
    assert.matches("no cluster token", out)
  end)

  it("refuses an empty token file", function()
    local f = os.tmpname()
    local code, out = run("MONARCH_TOKEN_FILE=" .. f, "--listen 0.0.0.0:0")
    os.remove(f)
    assert.are.equal(2, code)
    assert.matches("is empty or longer than", out)
  end)

  it("refuses to start a proc bound to every address", function()
    local code, out = run("", "--proc --rank 0 --world 1 --bind 0.0.0.0")
    assert.are.equal(2, code)
    assert.matches("no cluster token", out)
  end)

  it("listens on loopback when no address is given", function()
    local out, pidfile = os.tmpname(), os.tmpname()
    assert(sh(string.format("MONARCH_TOKEN=t %s >%s 2>&1 & echo $! >%s", WORKER, out, pidfile)))
    local pid = tonumber(slurp(pidfile))
    local line
    for _ = 1, 100 do
      line = slurp(out):match("listening on ([^\n]+)")
      if line then break end
      os.execute("sleep 0.05")
    end
    sh("kill " .. pid)
    os.remove(out)
    os.remove(pidfile)
    assert.matches("^127%.0%.0%.1:%d+$", line)
  end)
end)

describe("a script that issues calls without waiting for them", function()
  local procs, saved_window

  setup(function()
    procs = monarch.hosts():spawn_procs{ procs = 1 }
    procs:load "basic"
    saved_window = runtime.window
    runtime.window = 4096 -- small, so the bound is tight and the test quick
  end)

  teardown(function()
    runtime.window = saved_window
    procs:stop()
  end)

  it("keeps at most runtime.window calls in flight and the controller's memory flat over 200,000 calls", function()
    local conn, pid = procs:proc_list()[1].conn, procs:proc_list()[1].pid
    local max_inflight = 0
    local function issue(n)
      local last
      for i = 1, n do
        last = procs:call_one("noop")
        if i % 256 == 0 then
          local d = core.inflight(conn)
          if d > max_inflight then max_inflight = d end
        end
      end
      last:get()
      collectgarbage("collect")
    end
    issue(50000) -- warm up: the window fills, buffers reach their working size
    local rss0, prss0 = status_kb("self", "VmRSS"), status_kb(pid, "VmRSS")
    issue(200000)
    local grown = (status_kb("self", "VmRSS") - rss0) / 1024
    local pgrown = (status_kb(pid, "VmRSS") - prss0) / 1024
    assert.is_true(max_inflight <= runtime.window, "in flight: " .. max_inflight)
    assert.is_true(max_inflight >= runtime.window / 2, "the window never filled: " .. max_inflight)
    assert.is_true(grown < 16, string.format("controller RSS grew by %.1f MiB", grown))
    if not ASAN then assert.is_true(pgrown < 16, string.format("proc RSS grew by %.1f MiB", pgrown)) end
    assert.are.equal(0, core.inflight(conn))
  end)
end)
