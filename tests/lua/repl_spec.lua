-- The REPL's pure parts: compiling what was typed, showing values, completing names.
local repl = require "monarch.repl"

describe("repl.compile", function()
  it("takes an expression as one, so that it prints", function()
    local fn, is_expr = repl.compile("1 + 2")
    assert.is_true(is_expr)
    assert.are.equal(3, fn())
  end)

  it("takes a statement as a statement", function()
    local fn, is_expr = repl.compile("x_repl_spec = 5")
    assert.is_false(is_expr)
    fn()
    assert.are.equal(5, x_repl_spec)
    x_repl_spec = nil
  end)

  it("says a chunk is incomplete when it ends where more was expected", function()
    assert.are.same({ nil, "incomplete" }, { repl.compile("function f(x)") })
    assert.are.same({ nil, "incomplete" }, { repl.compile("t = {") })
    assert.are.same({ nil, "incomplete" }, { repl.compile("s = [[long") })
    assert.is_function((repl.compile("function f(x)\nreturn x\nend")))
  end)

  it("gives a real syntax error at once", function()
    local fn, err = repl.compile("x = = 1")
    assert.is_nil(fn)
    assert.matches("unexpected symbol", err)
  end)
end)

describe("repl.show", function()
  it("shows strings as they are and plain tables inline", function()
    assert.are.equal("abc", repl.show("abc"))
    assert.are.equal('{1, "a", ["a b"] = 2, x = true}', repl.show({ 1, "a", x = true, ["a b"] = 2 }))
  end)

  it("stops at a depth and a number of entries", function()
    assert.are.equal("{{{{...}}}}", repl.show({ { { { { 1 } } } } }))
    local big = {}
    for i = 1, 30 do big[i] = i end
    assert.matches("^{1, 2, .*20, %.%.%.}$", repl.show(big))
  end)

  it("uses __tostring where a value has one", function()
    assert.are.equal("thing", repl.show(setmetatable({}, { __tostring = function() return "thing" end })))
  end)
end)

describe("repl.candidates", function()
  local env = {
    monarch = { hosts = function() end, attach = function() end, _private = 1, config = {} },
    procs = setmetatable({ _procs = {} }, { __index = { call = function() end, call_one = function() end, shape = 1 } }),
    print = print,
  }

  it("completes the fields of a table after a dot", function()
    assert.are.same({ "monarch.attach", "monarch.config", "monarch.hosts" }, repl.candidates("monarch.", env))
    assert.are.same({ "monarch.hosts" }, repl.candidates("monarch.ho", env))
  end)

  it("completes methods after a colon, through the metatable", function()
    assert.are.same({ "procs:call", "procs:call_one" }, repl.candidates("procs:", env))
  end)

  it("completes globals and keywords", function()
    assert.are.same({ "print", "procs" }, repl.candidates("pr", env))
    assert.are.same({ "return", "repeat" }, (function()
      local c = repl.candidates("re", env)
      table.sort(c, function(a, b) return a > b end)
      return c
    end)())
  end)

  it("shows names starting with _ only when asked", function()
    assert.are.same({ "monarch._private" }, repl.candidates("monarch._", env))
  end)

  it("finds nothing after an unknown name or a call", function()
    assert.are.same({}, repl.candidates("nosuch.", env))
    assert.are.same({}, repl.candidates("f().", env))
  end)
end)

describe("repl.complete", function()
  local env = { monarch = { hosts = 1, host_mesh = 2, attach = 3 } }

  it("inserts what every completion shares", function()
    assert.are.equal("st", (repl.complete("monarch.ho", env)))
    assert.are.equal("ttach", (repl.complete("monarch.a", env)))
  end)

  it("lists the names when nothing more is shared", function()
    local insert, listing = repl.complete("monarch.", env)
    assert.is_nil(insert)
    assert.matches("attach", listing)
    assert.matches("host_mesh", listing)
    assert.is_nil(listing:find("monarch.", 1, true))
  end)

  it("lays a listing out in columns that fit the width", function()
    local text = repl.columns({ "aaaa", "bbbb", "cccc", "dddd" }, 12)
    assert.are.equal("aaaa  cccc\nbbbb  dddd", text)
  end)
end)
