-- tests/support/tree_fixture.lua: the three-level cast tree tree_spec and tree_spawn_spec share. The local agent
-- (monarch.hosts()) and seven real agents with fanout 2 (cast_min 2) are positions 0-1, 2-5 (children
-- of 0 and 1) and 6-7 (children of 2, which is daemons[2]).
--
--   local daemons, agents = tree.start()   -- in setup()
--   tree.stop(daemons)                     -- in teardown()
local monarch = require "monarch"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local agent = require "support.agent"

local sh = require("support.shell").quiet

local M = {}

--- Starts the seven agents and connects to them (one connection each: seven tree positions).
function M.start()
  monarch.hosts()
  monarch.configure{ cast_min = 2, fanout = 2 }
  local daemons, addrs = {}, {}
  for i = 1, 7 do
    daemons[i] = agent.start{ token = runtime.token }
    addrs[i] = daemons[i].addr
  end
  return daemons, mesh_mod.connect_agents(addrs)
end

--- Puts the defaults back and stops every agent (woken first, in case a spec left it stopped).
function M.stop(daemons)
  monarch.configure{ cast_min = 16, fanout = 16 }
  for _, d in ipairs(daemons) do
    sh("kill -CONT " .. (d.pid or 0))
    d:stop()
  end
end

return M
