-- Hosts that join a running job: real monarch-run jobs (tests/support/join_job.lua)
-- with the join port open, real `monarch-worker --join` agents started
-- while they run, and raw sockets that misbehave on the join port. Every
-- wait is for a line or an exit, with a generous deadline.
local ffi = require "ffi"
local core = require "monarch.core"
local raw = require "support.rawpeer"
local agent = require "support.agent"
local wait_for = require("support.wait").wait_for

local B = os.getenv("MONARCH_BUILD") or "build"
local TOKEN = "join-spec-token"

-- Each on its own: another spec may have declared it already.
pcall(ffi.cdef, "int bind(int, const void *, uint32_t);")
pcall(ffi.cdef, "int getsockname(int, void *, uint32_t *);")
pcall(ffi.cdef, "int kill(int, int);")

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local s = f:read("*a")
  f:close()
  return s
end

-- Sleeps without starting a process (a poll on nothing): waiting loops must not use up pids.
local function nap(s) ffi.C.poll(nil, 0, math.floor(s * 1000)) end


-- A port nothing listens on now: the kernel's pick for a socket we close again.
local function free_port()
  local fd = ffi.C.socket(2, 1, 0)
  local sa = ffi.new("struct sockaddr_in")
  sa.sin_family = 2
  ffi.C.inet_pton(2, "127.0.0.1", ffi.cast("char *", sa) + 4)
  assert(ffi.C.bind(fd, sa, ffi.sizeof(sa)) == 0)
  local len = ffi.new("uint32_t[1]", ffi.sizeof(sa))
  assert(ffi.C.getsockname(fd, sa, len) == 0)
  ffi.C.close(fd)
  return bit.bor(bit.lshift(bit.band(sa.sin_port, 0xff), 8), bit.rshift(sa.sin_port, 8))
end

-- busted keeps one finally per test: this one runs every cleanup it is given, last first.
local function cleanups()
  local fns = {}
  finally(function()
    for i = #fns, 1, -1 do pcall(fns[i]) end
  end)
  return function(fn) fns[#fns + 1] = fn end
end

-- ---- monarch-run jobs in the background --------------------------------------------

local Job = {}
Job.__index = Job

--- Starts `monarch-run ARGS` with the token (env: more shell words before it); its output goes to a file.
local function start_job(args, env)
  local log, pidfile = os.tmpname(), os.tmpname()
  os.execute(("env MONARCH_TOKEN=%s %s sh -c '%s/bin/monarch-run %s & echo $! > %s; wait $!; echo \"exit=$?\"' >%s 2>&1 &")
    :format(TOKEN, env or "", B, args, pidfile, log))
  local pid = wait_for(function() return tonumber(slurp(pidfile):match("%d+")) end, 30, "monarch-run to start")
  os.remove(pidfile)
  return setmetatable({ log = log, pid = pid }, Job)
end

function Job:output() return slurp(self.log) end

--- Waits for a line matching pattern; returns its first capture.
function Job:expect(pattern, timeout)
  return (wait_for(function() return self:output():match(pattern) end, timeout or 60,
    function() return "'" .. pattern .. "' in the job's output:\n" .. self:output() end))
end

--- Waits for the job to end; returns its exit status.
function Job:wait(timeout)
  return tonumber(self:expect("exit=(%d+)", timeout or 90))
end

--- Kills the job if it still runs (its local agent and procs die with it) and removes its log.
function Job:stop()
  local f = io.open("/proc/" .. self.pid .. "/cmdline", "rb") -- still our monarch-run, not a process that took its pid
  local cmd = f and f:read("*a") or ""
  if f then f:close() end
  if not self:output():match("exit=%d+") and cmd:find("monarch-run", 1, true) then ffi.C.kill(self.pid, 15) end
  os.remove(self.log)
end

-- Runs a command to its end (bounded by `timeout`); returns its output and exit status.
local function run(cmd)
  local f = io.popen("timeout 60 " .. cmd .. " 2>&1; echo \"rc=$?\"")
  local out = f:read("*a")
  f:close()
  return out, tonumber(out:match("rc=(%d+)%s*$"))
end

-- ---- sockets on the join port ----------------------------------------------------------

-- Connects to the join port; returns the peer and the nonce of its HELLO.
local function greeted(port)
  local p = raw.connect(port)
  local body = assert(p:read_frame(10))
  assert.are.equal("join", raw.hello_role(body))
  return p, raw.hello_nonce(body)
end

-- The ERROR the peer got next, and that the connection then closed.
local function refused(p, timeout)
  local msg = raw.error_message(p:read_frame(timeout or 10))
  assert.is_true(p:closed(10))
  p:close()
  return msg
end

-- ---- the specs ---------------------------------------------------------------------------

-- A script that prints "listening N PORT..." for the listening TCP sockets this process holds.
local PORTS_SCRIPT = [==[
local ffi = require "ffi"
pcall(ffi.cdef, "int getpid(void);")
local monarch = require "monarch"
local procs = monarch.hosts():spawn_procs { procs = 1 }
procs:load "basic"
procs:call("noop"):get()
local listening = {} -- socket inode -> port, for every socket in LISTEN state on this machine
for _, file in ipairs { "/proc/net/tcp", "/proc/net/tcp6" } do
  local f = io.open(file)
  for line in f:lines() do
    local field = {}
    for x in line:gmatch("%S+") do field[#field + 1] = x end
    if field[4] == "0A" then listening[field[10]] = tonumber(field[2]:match(":(%x+)$"), 16) end
  end
  f:close()
end
local mine = {}
local ls = io.popen("ls -l /proc/" .. ffi.C.getpid() .. "/fd")
for inode in ls:read("*a"):gmatch("socket:%[(%d+)%]") do
  if listening[inode] then mine[#mine + 1] = listening[inode] end
end
ls:close()
print("listening " .. #mine .. " " .. table.concat(mine, " "))
]==]

describe("a controller", function()
  local script

  setup(function()
    script = os.tmpname() .. ".lua"
    local f = assert(io.open(script, "w"))
    f:write(PORTS_SCRIPT)
    f:close()
  end)

  teardown(function() os.remove(script) end)

  it("opens no port of its own unless asked to listen for joins", function()
    local out, rc = run(("env MONARCH_TOKEN=%s %s/bin/monarch-run %s"):format(TOKEN, B, script))
    assert.are.equal(0, rc, out)
    assert.matches("listening 0 \n", out)
  end)

  it("listens on exactly the join port with --listen-joins or MONARCH_JOIN_ADDR, and says where", function()
    for _, how in ipairs { { "", "--listen-joins 127.0.0.1:0" }, { "MONARCH_JOIN_ADDR=127.0.0.1:0", "" } } do
      local out, rc = run(("env MONARCH_TOKEN=%s %s %s/bin/monarch-run %s %s"):format(TOKEN, how[1], B, how[2], script))
      assert.are.equal(0, rc, out)
      local said = out:match("listening for joining hosts on 127%.0%.0%.1:(%d+)")
      assert.is_not_nil(said, out)
      assert.are.equal("listening 1 " .. said, out:match("listening 1 %d+"), out)
    end
  end)
end)

describe("a job listening for joins", function()
  local job, port, first

  setup(function()
    -- Its first host listens on every loopback address, so that a JOIN can name it at another one.
    first = agent.start { token = TOKEN, host = "0.0.0.0" }
    job = start_job("--hosts 127.0.0.1:" .. first.port .. " --listen-joins 127.0.0.1:0 tests/support/join_job.lua join")
    port = tonumber(job:expect("listening for joining hosts on 127%.0%.0%.1:(%d+)"))
    job:expect("waiting for a host")
  end)

  teardown(function()
    job:stop()
    first:stop()
  end)

  it("greets every connection with a HELLO of role join and refuses garbage with one ERROR each", function()
    local p = greeted(port)
    p:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert.matches("join frame too large", refused(p))
    p = greeted(port)
    p:send(raw.frame("\xc1\xc1\xc1"))
    assert.matches("not valid msgpack", refused(p))
    local nonce
    p, nonce = greeted(port)
    p:send(raw.auth_frame(TOKEN, nonce)) -- a controller's AUTH is no JOIN
    assert.matches("expected JOIN as the first message, got type 2", refused(p))
    p = greeted(port)
    p:send(raw.frame("\x93\x20\x01\x02")) -- a JOIN of 3 elements
    assert.matches("malformed JOIN", refused(p))
  end)

  it("refuses a JOIN with a wrong token, and an agent holding one exits saying so", function()
    local p, nonce = greeted(port)
    p:send(raw.join_frame("not the token", nonce, "127.0.0.1:9"))
    assert.matches("authentication failed: wrong cluster token", refused(p))
    local out, rc = run(("env MONARCH_TOKEN=wrong %s/bin/monarch-worker --once --join 127.0.0.1:%d"):format(B, port))
    assert.are.equal(2, rc, out)
    assert.matches("cannot join the controller at 127%.0%.0%.1:" .. port .. ": authentication failed: wrong cluster token", out)
  end)

  it("refuses a JOIN naming an address that is not a numeric HOST:PORT", function()
    local p, nonce = greeted(port)
    p:send(raw.join_frame(TOKEN, nonce, "localhost:7000"))
    assert.matches("not a numeric IPv4:PORT", refused(p))
  end)

  it("refuses connections beyond 16 at once, and ends those that do not finish in time", function()
    local waiting = {}
    for i = 1, 16 do waiting[i] = greeted(port) end
    local extra = raw.connect(port)
    assert.matches("too many join connections at once", refused(extra))
    for _, p in ipairs(waiting) do assert.matches("join not completed in time", refused(p, 30)) end
  end)

  it("lives on after a JOIN that names an address where no agent listens", function()
    local p, nonce = greeted(port)
    p:send(raw.join_frame(TOKEN, nonce, "127.0.0.1:" .. free_port()))
    assert.are.equal(33, p:read_frame(10):byte(2)) -- JOINED: the MAC was right
    p:close()
    job:expect("host agent 127%.0%.0%.1:%d+ cannot be reached")
  end)

  it("does not take in twice a host agent it has, named at another address", function()
    local p, nonce = greeted(port)
    p:send(raw.join_frame(TOKEN, nonce, "127.0.0.2:" .. first.port))
    assert.are.equal(33, p:read_frame(10):byte(2))
    p:close()
    job:expect("host agent at 127%.0%.0%.2:" .. first.port .. " is host 0 of this job already %(127%.0%.0%.1:" ..
      first.port .. "%); not added again")
  end)

  it("takes in a monarch-worker --join started mid-run: on_join sees it, its procs take calls and a tensor from a peer", function()
    local w = agent.start { token = TOKEN, args = "--once --join 127.0.0.1:" .. port }
    finally(function() w:stop() end)
    assert.are.equal(0, job:wait(), job:output())
    local out = job:output()
    assert.matches("host %S+ %(127%.0%.0%.1:" .. w.port .. "%) joined: 2 hosts", out)
    assert.matches("hosts 2\n", out)
    assert.matches("grown 2 hosts x 2 procs = 4\n", out)
    assert.matches("new ranks 2/4 3/4\n", out)
    assert.matches("controller bytes 0\n", out) -- the tensor went proc to proc
    assert.matches("sums 8390656 8390656 8390656 8390656\n", out)
    assert.matches("all_reduce 33562624\n", out)
    assert.matches("kept on 2\n", out)
    -- Everything refused above was logged, and the controller lived on.
    assert.matches("refused a join from 127%.0%.0%.1:%d+: authentication failed: wrong cluster token", out)
    assert.matches("refused a join from 127%.0%.0%.1:%d+: join frame too large", out)
    assert.matches("joined the controller at 127%.0%.0%.1:" .. port .. "; it connects to 127%.0%.0%.1:" .. w.port,
      w:output())
  end)
end)

describe("monarch-worker --join", function()
  it("keeps trying while the controller is not listening yet, then joins it", function()
    local later = cleanups()
    local port = free_port()
    local w = agent.start { token = TOKEN, args = "--once --join 127.0.0.1:" .. port }
    later(function() w:stop() end)
    nap(0.5) -- a few refused attempts first
    local job = start_job(("--listen-joins 127.0.0.1:%d tests/support/join_job.lua join"):format(port))
    later(function() job:stop() end)
    wait_for(function() return w:output():match("joined the controller") end, 60,
      function() return "the agent to join; it said:\n" .. w:output() .. "\nthe job said:\n" .. job:output() end)
    assert.are.equal(0, job:wait(), job:output())
    assert.matches("sums 8390656 8390656 8390656 8390656\n", job:output())
    assert.matches("joined the controller", w:output())
  end)

  it("joins again when the controller that took its JOIN never connects", function()
    -- A join port of our own: it answers the JOIN correctly (an independent implementation of
    -- the exchange), then never dials; the agent must come back.
    local port = raw.listen()
    local later = cleanups()
    later(function() port:close() end)
    local w = agent.start { token = TOKEN, env = "MONARCH_JOIN_WAIT=1", args = "--join 127.0.0.1:" .. port.port }
    later(function() w:stop() end)
    local nonce = string.rep("\x11", 32)
    local p = assert(port:accept(10), "the agent did not dial the join port")
    p:send(raw.join_hello_frame(nonce))
    local join = assert(p:read_frame(10))
    assert.matches("127%.0%.0%.1:" .. w.port, join) -- the address to dial back, in the clear
    p:send(raw.joined_frame(TOKEN, nonce, raw.join_nonce(join)))
    assert.is_true(p:closed(10)) -- it hangs up after JOINED
    p:close()
    wait_for(function() return w:output():match("joined the controller at 127%.0%.0%.1:" .. port.port) end, 10,
      "the agent to accept our JOINED")
    local again = assert(port:accept(15), "the agent did not join again")
    again:close()
    assert.matches("did not connect within 1 s of taking the join; joining again", w:output())
  end)

  it("gives up after MONARCH_JOIN_TIMEOUT with the reason, and exits 2", function()
    local out, rc = run(("env MONARCH_TOKEN=%s MONARCH_JOIN_TIMEOUT=1 %s/bin/monarch-worker --join 127.0.0.1:%d")
      :format(TOKEN, B, free_port()))
    assert.are.equal(2, rc, out)
    assert.matches("cannot join the controller at 127%.0%.0%.1:%d+: cannot connect: connection refused %(gave up after %d+ attempts", out)
  end)

  it("refuses to take a host agent's port for a join port", function()
    local daemon = agent.start { token = TOKEN }
    finally(function() daemon:stop() end)
    local out, rc = run(("env MONARCH_TOKEN=%s %s/bin/monarch-worker --join %s"):format(TOKEN, B, daemon.addr))
    assert.are.equal(2, rc, out)
    assert.matches("the peer is a monarch agent, not a controller's join port", out)
  end)

  it("refuses a join address that is not HOST:PORT", function()
    local out, rc = run(("env MONARCH_TOKEN=%s %s/bin/monarch-worker --join nowhere"):format(TOKEN, B))
    assert.are.equal(2, rc, out)
    assert.matches("%-%-join wants the controller's join address HOST:PORT, got 'nowhere'", out)
  end)
end)

describe("a job started with --hostfile", function()
  it("takes in the hosts of lines added to the file when it calls hosts:refresh()", function()
    local later = cleanups()
    local first = agent.start { token = TOKEN }
    later(function() first:stop() end)
    local second = agent.start { token = TOKEN }
    later(function() second:stop() end)
    local hostfile = os.tmpname()
    later(function() os.remove(hostfile) end)
    local f = assert(io.open(hostfile, "w"))
    f:write("# the job's first host\n", first.addr, "\n")
    f:close()
    local job = start_job(("--hostfile %s tests/support/join_job.lua refresh %s %s"):format(hostfile, hostfile, second.addr))
    later(function() job:stop() end)
    assert.are.equal(0, job:wait(), job:output())
    local out = job:output()
    assert.matches("refreshed 1\n", out)
    assert.matches("hosts 2\n", out)
    assert.matches("new ranks 2/4 3/4\n", out)
    assert.matches("controller bytes 0\n", out)
    assert.matches("sums 8390656 8390656 8390656 8390656\n", out)
  end)
end)

describe("the Lua face of joining hosts", function()
  local monarch = require "monarch"
  local bulk = require "monarch.bulk"
  local hosts, procs

  setup(function()
    hosts = monarch.hosts()
    procs = hosts:spawn_procs { procs = 2 }
    procs:load "basic"
  end)

  teardown(function() procs:stop() end)

  it("copies a tensor held by some procs of a mesh to the others, proc to proc", function()
    local holder = procs:slice { procs = { 0, 1 } }
    local t = holder:tensor("f64", { 1000 })
    holder:call("iota", t, 1):get()
    local moved = bulk.stats.tcp_bytes + bulk.stats.local_bytes
    t:copy_from_peer(procs):get()
    assert.are.equal(moved, bulk.stats.tcp_bytes + bulk.stats.local_bytes)
    assert.are.equal(procs, t.mesh)
    assert.are.same({ 500500, 500500 }, procs:call("sum", t):get():values())
    local copies = t:fetch():get()
    assert.are.equal(1000, copies[2][1000])
    assert.is_true(t:copy_from_peer(procs):done()) -- nothing left to copy: done at once
    t:free()
  end)

  it("refuses a mesh that lacks the tensor's procs, an unknown source and unknown options", function()
    local t = procs:tensor("f32", { 4 })
    assert.has_error(function() t:copy_from_peer(procs:slice { procs = 0 }) end,
      "copy_from_peer: the mesh lacks rank 1, which holds tensor " .. t.__mn_tensor .. ": pass a mesh grown from its own")
    assert.has_error(function() t:copy_from_peer(procs, { from = 7 }) end,
      "copy_from_peer: no proc of rank 7 holds tensor " .. t.__mn_tensor)
    assert.has_error(function() t:copy_from_peer(procs, { form = 0 }) end,
      "copy_from_peer: option form is unknown or not a number (known: from, timeout)")
    assert.has_error(function() t:copy_from_peer("procs") end, "copy_from_peer wants a ProcMesh")
  end)

  it("refuses to grow onto nothing, or a mesh without its hosts dimension", function()
    assert.has_error(function() procs:grow {} end, "grow wants a list of host agents (those on_join gives) or a HostMesh")
    assert.has_error(function() procs:grow { {} } end, "grow: entry 1 is not a host agent")
    assert.has_error(function() procs:slice { hosts = 0 }:grow(hosts) end,
      "grow needs a mesh whose first dimension is 'hosts' (as spawn_procs makes it), not {procs=2}")
  end)

  it("says what is wrong with a listen address, a handler or a hostfile", function()
    assert.has_error(function() monarch.listen { addr = "nowhere" } end,
      "listen: addr wants a numeric HOST:PORT like '0.0.0.0:7100', got nowhere")
    assert.has_error(function() monarch.listen { port = 7100 } end, "listen: unknown option 'port' (known: addr)")
    assert.has_error(function() hosts:on_join("fn") end, "on_join wants a function")
    assert.has_error(function() hosts:refresh() end,
      "refresh: this job has no hostfile (monarch-run --hostfile FILE, or pass a path)")
    local path = os.tmpname()
    local f = assert(io.open(path, "w"))
    f:write("127.0.0.1:1  # fine\n\nnot an address\n")
    f:close()
    assert.has_error(function() hosts:refresh(path) end, "refresh: " .. path .. ":3: 'not an address' is not HOST:PORT")
    os.remove(path)
    assert.has_error(function() hosts:refresh(path) end)
  end)
end)
