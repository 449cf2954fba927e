-- monarch.runtime's message router, with no cluster.
require "monarch"
local core = require "monarch.core"
local runtime = require "monarch.runtime"

describe("runtime.on_message", function()
  it("gives each message type one handler: a second one is an error", function()
    -- monarch.persist owns REPLY, monarch.procs owns LOG.
    assert.has_error(function() runtime.on_message(core.MSG.REPLY, function() end) end,
      "message type " .. core.MSG.REPLY .. " already has a handler")
    assert.has_error(function() runtime.on_message(core.MSG.LOG, function() end) end,
      "message type " .. core.MSG.LOG .. " already has a handler")
  end)

  it("wants a message type and a function", function()
    assert.has_error(function() runtime.on_message("LOG", function() end) end,
      "on_message wants a message type (core.MSG) and a function")
    assert.has_error(function() runtime.on_message(core.MSG.STATUS) end,
      "on_message wants a message type (core.MSG) and a function")
  end)
end)
