-- A reconnect whose handshake fails is retried, not left half-open: the
-- controller redials until the reconnect window is spent (issue 27: a
-- failed reconnect handshake left the connection in its handshake state
-- with no link and no timer, so the host was neither back nor lost).
local monarch = require "monarch"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local agent = require "support.agent"
local wait_for = require("support.wait").wait_for

describe("a host agent frozen past the handshake limit", function()
  local daemon

  setup(function()
    monarch.hosts()
    daemon = agent.start{ token = runtime.token }
  end)

  teardown(function()
    os.execute("kill -CONT " .. daemon.pid .. " 2>/dev/null")
    daemon:stop()
    monarch.configure{ heartbeat_timeout = 3.0, reconnect = 5.0 }
  end)

  it("is redialled after the failed handshake and comes back when it thaws", function()
    -- A window longer than the handshake limit (5 s): the first redial's handshake fails inside it.
    monarch.configure{ heartbeat_timeout = 1.0, reconnect = 30.0 }
    local agents = mesh_mod.connect_agents{ daemon.addr }
    local a = agents[1]
    local m = mesh_mod.host_mesh(agents):spawn_procs{ procs = 1 }
    m:load "basic"
    assert.are.equal(3, m:call_one("echo", 3):get())
    os.execute("kill -STOP " .. daemon.pid)
    wait_for(function() return a.state == "reconnecting" end, 10, "the agent's link to be lost")
    -- The kernel still accepts the redial for the stopped agent; no HELLO comes, so that attempt ends at
    -- the handshake limit. The freeze outlasts it: the length of the freeze is what is tested here.
    monarch.sleep(7)
    assert.are.equal("reconnecting", a.state)
    os.execute("kill -CONT " .. daemon.pid)
    wait_for(function() return a.state == "ready" end, 10, function() return "the agent to reconnect (it is " .. a.state .. ")" end)
    assert.are.equal(4, m:call_one("echo", 4):get(10))
    m:stop()
  end)
end)
