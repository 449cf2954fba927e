-- A real network cut between the controller and a host, made with a network
-- namespace and a veth pair (needs root and iproute2; skipped otherwise).
local monarch = require "monarch"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local agent = require "support.agent"

-- Named after this process (tests/support/netns.lua), so that suites running side by side (other checkouts on
-- one machine) never share a namespace, an interface or a subnet.
local netns = require "support.netns"
local NS, HOST_IF, NS_IF = netns.name("mn_part"), "mnp" .. netns.ID .. "a", "mnp" .. netns.ID .. "b"
local NET = netns.subnet(64)
local NS_IP = NET .. ".2"

local ok_netns, why = netns.check(NS)
if not ok_netns then
  describe("network partition", function()
    pending("skipped: " .. why)
  end)
  print("partition_spec: skipped: " .. why)
  return
end

describe("a network partition between the controller and a host", function()
  local port, far, link

  before_each(function()
    monarch.hosts()
    monarch.configure{ heartbeat = 0.1, heartbeat_timeout = 1.0, reconnect = 4.0 }
    link = netns.pair{ ns = NS, host_if = HOST_IF, ns_if = NS_IF, net = NET }
    -- The far side gives up quickly too: silence 2 s, grace 1 s, procs' orphan timeout 3 s.
    far = agent.start{ token = runtime.token, wrap = link.wrap, host = NS_IP,
      env = "MONARCH_AGENT_SILENCE=2 MONARCH_AGENT_GRACE=1", args = "--orphan-timeout 3" }
    port = far.port
  end)

  after_each(function()
    if link then link:destroy() end
    far:stop()
    monarch.configure{ heartbeat = 0.5, heartbeat_timeout = 3.0, reconnect = 5.0 }
  end)

  it("heals within the reconnect window and runs every call exactly once", function()
    local losses = 0
    local off = monarch.on_host_loss(function() losses = losses + 1 end)
    finally(function() off() end)
    local agents = mesh_mod.connect_agents{ NS_IP .. ":" .. port }
    local procs = mesh_mod.host_mesh(agents):spawn_procs{ procs = 1 }
    procs:load "faulty"
    procs:load "basic"
    local futs = {}
    for i = 1, 100 do futs[i] = procs:call_one("bump") end
    futs[100]:get(5)
    -- Cut, keep sending, heal after the heartbeat has noticed.
    assert(link:down())
    for i = 101, 300 do futs[i] = procs:call_one("bump") end
    local t0 = monarch.now()
    while monarch.now() - t0 < 1.8 do runtime.pump(0.05) end
    assert.are.equal("reconnecting", procs:procs()[1].state)
    assert(link:up())
    for i = 1, 300 do assert.are.equal(i, futs[i]:get(10)[1]) end
    assert.are.equal(300, procs:call_one("bumps"):get(5))
    assert.are.equal("ready", procs:procs()[1].state)
    assert.are.equal(0, losses, "a cut that healed in time counted as a lost host")
    procs:stop()
  end)

  it("shrinks to the near host when the cut does not heal: one host_lost event, the survivors serve", function()
    local near = agent.start{ token = runtime.token }
    local events = {}
    local off = monarch.on_host_loss(function(ev) events[#events + 1] = ev end)
    local procs
    finally(function() -- busted keeps one finally per test
      off()
      if procs then procs:stop() end
      near:stop()
    end)
    local agents = mesh_mod.connect_agents{ near.addr, NS_IP .. ":" .. port }
    procs = mesh_mod.host_mesh(agents):spawn_procs{ procs = 2 }
    procs:load "basic"
    procs:call("noop"):get(5)
    assert(link:down())
    local t0 = monarch.now()
    while #events == 0 and monarch.now() - t0 < 15 do runtime.pump(0.05) end
    assert.are.equal(1, #events, "no host_lost event within 15 s")
    assert.are.equal(NS_IP .. ":" .. port, events[1].addr)
    assert.are.same({ 2, 3 }, events[1].ranks)
    assert.matches("reconnecting failed", events[1].cause)
    -- Not before the reconnect window (4 s): a silent link is given the whole of it.
    assert.is_true(monarch.now() - t0 > 3.5, "shrank after " .. (monarch.now() - t0) .. " s")
    local s = procs:survivors()
    assert.are.same({ hosts = 1, procs = 2 }, s:sizes())
    assert.are.same({ 0, 1 }, s:rank())
    assert.are.equal(7, s:slice{ hosts = 0, procs = 1 }:call_one("echo", 7):get(5))
  end)

  it("fails clearly when the cut does not heal, and the far side cleans up", function()
    local agents = mesh_mod.connect_agents{ NS_IP .. ":" .. port }
    local procs = mesh_mod.host_mesh(agents):spawn_procs{ procs = 2 }
    procs:load "basic"
    procs:on_failure(function() end)
    local f = procs:call("sleep", 0.2)
    f:get(5)
    assert(link:down())
    local g = procs:call("noop")
    local ok, err = pcall(function() return g:get(20) end)
    assert.is_false(ok)
    assert.are.equal("proc_failed", err.kind)
    assert.matches("reconnecting failed", err.message)
    -- Nothing stays behind on the far side: agent silence + grace kill the procs.
    local t0 = monarch.now()
    while netns.pids(NS) > 1 and monarch.now() - t0 < 10 do runtime.pump(0.2) end
    assert.are.equal(1, netns.pids(NS), "the far agent said: " .. far:output()) -- only the agent daemon itself
  end)
end)
