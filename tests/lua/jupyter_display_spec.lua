-- How values look in a notebook (monarch.jupyter_display): the MIME bundles a cell's result becomes.
local show = require "monarch.jupyter_display"
local shape = require "monarch.shape"
local value_mesh = require "monarch.value_mesh"

describe("jupyter_display.bundle of a ValueMesh", function()
  it("is a table with one column per dimension, counting in flat order, then the value", function()
    local vm = value_mesh.new(shape.new({ "a", "b" }, { 2, 3 }), { 1, 2, 3, 4, 5, 6 }, 6)
    local html = show.bundle(vm)["text/html"]
    assert.truthy(html:find("<th>a</th><th>b</th><th>value</th>", 1, true), html)
    assert.truthy(html:find("<tr><td>0</td><td>2</td><td>3</td></tr><tr><td>1</td><td>0</td><td>4</td></tr>", 1, true),
      html)
    assert.truthy(html:find("<tr><td>1</td><td>2</td><td>6</td></tr></tbody>", 1, true), html)
    assert.are.equal(tostring(vm), show.bundle(vm)["text/plain"])
  end)

  it("escapes values for HTML", function()
    local vm = value_mesh.new(shape.new({ "procs" }, { 2 }), { "<b>&", 'x"y' }, 2)
    local html = show.bundle(vm)["text/html"]
    assert.truthy(html:find("<td>&quot;&lt;b&gt;&amp;&quot;</td>", 1, true), html)
    assert.falsy(html:find("<b>", 1, true), html)
  end)

  it("shows a mesh of no dimensions as its one value", function()
    local vm = value_mesh.new(shape.new({}, {}), { 7 }, 1)
    assert.truthy(show.bundle(vm)["text/html"]:find("<thead><tr><th>value</th></tr></thead><tbody><tr><td>7</td></tr>",
      1, true))
  end)

  it("counts the rows past MAX_ROWS instead of showing them", function()
    local n = show.MAX_ROWS + 3
    local vals = {}
    for i = 1, n do vals[i] = i end
    local html = show.bundle(value_mesh.new(shape.new({ "procs" }, { n }), vals, n))["text/html"]
    assert.truthy(html:find("<p>... 3 more</p>", 1, true), html)
    local _, rows = html:gsub("<tr><td>", "")
    assert.are.equal(show.MAX_ROWS, rows)
  end)
end)

describe("jupyter_display.escape", function()
  it("leaves text without & < > \" as it is and replaces those four", function()
    assert.are.equal("plain 1.5", show.escape("plain 1.5"))
    assert.are.equal("&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;", show.escape('<a href="x">&</a>'))
    assert.are.equal("12", show.escape(12))
  end)
end)
