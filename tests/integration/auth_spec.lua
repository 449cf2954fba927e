-- A host agent run as a daemon, attacked with raw sockets: nothing is acted
-- on before the handshake, garbage gets a clear ERROR, and the agent lives on.
local monarch = require "monarch"
local mesh = require "monarch.mesh"
local runtime = require "monarch.runtime"
local raw = require "support.rawpeer"
local agent = require "support.agent"

describe("a host agent daemon", function()
  local token, port, daemon

  setup(function()
    monarch.hosts() -- starts the runtime, so its token is known
    token = runtime.token
    daemon = agent.start{ token = token }
    port = daemon.port
  end)

  teardown(function()
    daemon:stop()
  end)

  local function hello()
    local p = raw.connect(port)
    local body = assert(p:read_frame(2))
    return p, raw.hello_nonce(body)
  end

  it("greets with HELLO and rejects a wrong token before anything else", function()
    local p, nonce = hello()
    p:send(raw.auth_frame("not the token", nonce))
    local msg = raw.error_message(p:read_frame(2))
    assert.matches("authentication failed: wrong cluster token", msg)
    assert.is_true(p:closed(2))
  end)

  it("refuses a SPAWN sent in place of AUTH", function()
    local p = hello()
    p:send(raw.frame("\x93\x0a\x01\x81\xa5count\x01"))
    assert.matches("expected AUTH", raw.error_message(p:read_frame(2)))
    assert.is_true(p:closed(2))
  end)

  it("refuses a replayed AUTH from an earlier connection", function()
    local p1, n1 = hello()
    local auth = raw.auth_frame(token, n1)
    p1:send(auth)
    assert.are.equal(3, p1:read_frame(2):byte(2)) -- WELCOME
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

  it("drops a connection that never finishes its frame, without harm", function()
    local p = hello()
    p:send("\0\0\0\40\x94")
    p:close()
  end)

  it("answers malformed msgpack after authentication with an ERROR", function()
    local p, nonce = hello()
    p:send(raw.auth_frame(token, nonce))
    assert.are.equal(3, p:read_frame(2):byte(2))
    p:send(raw.frame("\xc1\xc1\xc1"))
    local msg = raw.error_message(p:read_frame(2))
    assert.matches("not valid msgpack", msg)
    assert.is_true(p:closed(2))
  end)

  it("still serves a real controller after all of that", function()
    local agents = mesh.connect_agents{ "127.0.0.1:" .. port }
    local procs = mesh.host_mesh(agents):spawn_procs{ procs = 2 }
    procs:load "basic"
    assert.are.same({ { 0, 2 }, { 1, 2 } }, procs:call("rank"):get():values())
    procs:stop()
  end)
end)
