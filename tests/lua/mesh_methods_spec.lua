-- mesh.METHODS: the one list of ProcMesh methods and the modules that make them.
require "monarch"
local mesh = require "monarch.mesh"

describe("mesh.METHODS", function()
  it("lists every method of ProcMesh", function()
    for name, v in pairs(mesh.ProcMesh) do
      if type(v) == "function" and not name:match("^__") then
        assert.is_not_nil(mesh.METHODS[name], "ProcMesh:" .. name .. " is not in mesh.METHODS")
      end
    end
  end)

  it("has each listed method made by its module once monarch is loaded", function()
    for name in pairs(mesh.METHODS) do
      assert.are.equal("function", type(mesh.ProcMesh[name]), name)
      assert.is_false(mesh.is_stub(name), "ProcMesh:" .. name .. " is still a stub")
    end
  end)

  it("refuses a method from a module it does not list for it", function()
    assert.has_error(function() mesh.provide("monarch.gpu", { spawn = function() end }) end,
      "monarch.gpu cannot add ProcMesh:spawn (mesh.lua lists it for monarch.actor)")
    assert.has_error(function() mesh.provide("monarch.x", { frobnicate = function() end }) end,
      "monarch.x cannot add ProcMesh:frobnicate (mesh.lua lists it for nil)")
  end)
end)
