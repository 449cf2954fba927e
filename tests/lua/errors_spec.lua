-- MonarchError: the structured error every failure becomes.
local errors = require "monarch.errors"

describe("tostring(MonarchError)", function()
  it("names the kind, kernel, rank, host, pid and message", function()
    local e = errors.new { kind = "kernel", kernel = "axpy", rank = 3, host = "node7", pid = 4242,
      message = "n must be positive" }
    assert.equal("monarch: kernel in 'axpy' on rank 3, host node7, pid 4242: n must be positive", tostring(e))
  end)

  it("leaves out what it does not know", function()
    assert.equal("monarch: timeout: took too long", tostring(errors.new { kind = "timeout", message = "took too long" }))
    assert.equal("monarch: proc_failed on rank 0: dead",
      tostring(errors.new { kind = "proc_failed", rank = 0, message = "dead" }))
  end)

  it("shows rank 0 but not pid 0", function()
    local s = tostring(errors.new { kind = "kernel", rank = 0, host = "h", pid = 0, message = "m" })
    assert.equal("monarch: kernel on rank 0, host h: m", s)
  end)

  it("counts the other failures of the same call", function()
    local e = errors.new { kind = "kernel", kernel = "k", rank = 1, message = "bad", others = 3 }
    assert.equal("monarch: kernel in 'k' on rank 1: bad (and 3 more failures)", tostring(e))
  end)

  it("says failure, not failures, for exactly one other", function()
    local e = errors.new { kind = "kernel", message = "bad", others = 1 }
    assert.matches("(and 1 more failure)", tostring(e), 1, true)
    assert.is_nil(tostring(e):find("failures", 1, true))
  end)

  it("says nothing of others when there are none", function()
    local e = errors.new { kind = "kernel", message = "bad", others = 0 }
    assert.equal("monarch: kernel: bad", tostring(e))
  end)
end)

describe("errors.new", function()
  it("keeps every field it was given, cause included", function()
    local e = errors.new { kind = "proc_failed", message = "m", cause = "signal 9", rank = 2 }
    assert.equal("proc_failed", e.kind)
    assert.equal("m", e.message)
    assert.equal("signal 9", e.cause)
    assert.equal(2, e.rank)
  end)

  it("makes an error that error() and pcall carry unchanged", function()
    local e = errors.new { kind = "kernel", message = "m" }
    local ok, got = pcall(error, e, 0)
    assert.is_false(ok)
    assert.equal(e, got)
  end)
end)

describe("errors.is", function()
  it("is true for a MonarchError", function()
    assert.is_true(errors.is(errors.new { kind = "kernel", message = "m" }))
  end)

  it("is false for strings, plain tables and nil", function()
    assert.is_false(errors.is("monarch: kernel: m"))
    assert.is_false(errors.is({ kind = "kernel", message = "m" }))
    assert.is_false(errors.is(nil))
  end)
end)

describe("monarch.errors.KINDS", function()
  local function read(path)
    local f = assert(io.open(path, "rb"))
    local s = f:read("*a")
    f:close()
    return s
  end

  local function lines_of(cmd)
    local out, f = {}, assert(io.popen(cmd))
    for l in f:lines() do out[#out + 1] = l end
    f:close()
    return out
  end

  it("is the table of kinds in docs/lua-api.md, in the same order and words", function()
    local doc = read("docs/lua-api.md")
    local from = assert(doc:find("| Kind | Raised when |", 1, true), "no table of kinds in docs/lua-api.md")
    local rows = {}
    for line in doc:sub(from):gmatch("([^\n]*)\n") do
      if line == "" and #rows > 0 then break end
      local kind, when = line:match("^| `([%w_]+)` | (.*) |$")
      if kind then rows[#rows + 1] = { kind, when } end
    end
    assert.are.same(errors.KINDS, rows)
  end)

  it("has every kind the Lua library and the procs raise", function()
    local found = {}
    -- kind = "x" in the library (not in comments), and the kinds the C side puts in a RESULT.
    for _, path in ipairs(lines_of("ls lua/monarch/*.lua lua/monarch/proc/*.lua")) do
      for line in read(path):gmatch("[^\n]+") do
        if not line:match("^%s*%-%-") then
          for k in line:gmatch('kind = "([%w_]+)"') do found[k] = path end
          for k in line:gmatch('kind = [%w_.]+ and "([%w_]+)" or "([%w_]+)"') do found[k] = path end
        end
      end
    end
    for _, path in ipairs(lines_of("ls host/*/*.c")) do
      local src = read(path)
      for k in src:gmatch('err_kind = "([%w_]+)"') do found[k] = path end
      for k in src:gmatch('reply_err%([^,]+, [^,]+, "([%w_]+)"') do found[k] = path end
      for k in src:gmatch('mn_pack_cstr%(&pk, "kind"%);%s*mn_pack_cstr%(&pk, "([%w_]+)"%)') do found[k] = path end
    end
    found.procs, found.actors = nil, nil -- mesh handles given to actors, not failures
    assert.is_not_nil(found.collective_mismatch) -- the scan reaches the C side
    for k, path in pairs(found) do
      assert.is_not_nil(errors.KIND[k], "kind '" .. k .. "' (" .. path .. ") is not in monarch.errors.KINDS")
    end
  end)
end)
