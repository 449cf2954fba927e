-- The ranks of the Lua modules (docs/architecture.md, "Lua modules and their ranks"), checked the way
-- tests/layers.sh checks the C layers: a module requires only modules of a lower rank (or a sibling of
-- its own rank this table allows), and no module assigns a function onto another module's table.
-- A cycle is broken one way: the lower module has a hook list (M.hooks.x = {}) or a registration
-- function (future.set_runtime) that the higher module hands its part to.

-- rank -> what it holds. A module may require any module of a lower rank.
local TIERS = { "leaves", "the loop", "procs", "meshes", "features", "monarch", "training", "the REPL", "the notebook" }

local RANKS = {
  -- 1 leaves: need nothing of ours but each other
  ["monarch.errors"] = 1, ["monarch.shape"] = 1, ["monarch.value_mesh"] = 1, ["monarch.trace"] = 1,
  ["monarch.trace_json"] = 1, ["monarch.launch"] = 1, ["monarch.checks"] = 1,
  -- 2 the loop: futures, tasks and timers, calls in flight, the pump, and what rides on its clock
  ["monarch.future"] = 2, ["monarch.tasks"] = 2, ["monarch.calls"] = 2, ["monarch.runtime"] = 2,
  ["monarch.log"] = 2, ["monarch.bulk"] = 2,
  -- 3 procs: proc and host-agent lifecycles, spawns
  ["monarch.procs"] = 3,
  -- 4 meshes: HostMesh, ProcMesh and its kernel calls
  ["monarch.mesh"] = 4,
  -- 5 features: ProcMesh methods of other modules, and tools over meshes
  ["monarch.tensor"] = 5, ["monarch.collective"] = 5, ["monarch.gpu"] = 5, ["monarch.actor"] = 5,
  ["monarch.persist"] = 5, ["monarch.join"] = 5, ["monarch.status"] = 5, ["monarch.top"] = 5,
  ["monarch.checkpoint"] = 5, ["monarch.plot"] = 5, ["monarch.launch_ray"] = 5, ["monarch.ship"] = 5,
  -- 6 the library's face
  ["monarch"] = 6,
  -- 7 training as a library (monarch.train), over the whole library
  ["monarch.train"] = 7, ["monarch.train_opts"] = 7, ["monarch.train_progress"] = 7, ["monarch.train_state"] = 7,
  ["monarch.train_ckpt"] = 7, ["monarch.train_recover"] = 7,
  -- 8 the interactive loop of monarch-run -i, over the whole library
  ["monarch.repl"] = 8,
  -- 9 the Jupyter kernel, over the REPL
  ["monarch.jupyter"] = 9, ["monarch.jupyter_display"] = 9,
}

-- Requires between modules of one rank that are allowed (module -> the siblings it may require).
-- Each line is one edge of an order within the rank; the spec checks there is no cycle among them.
local SIBLINGS = {
  ["monarch.trace"] = { "monarch.trace_json" },
  ["monarch.tasks"] = { "monarch.future" },
  ["monarch.calls"] = { "monarch.future", "monarch.tasks" },
  ["monarch.runtime"] = { "monarch.future", "monarch.tasks", "monarch.calls" },
  ["monarch.log"] = { "monarch.runtime" },
  ["monarch.bulk"] = { "monarch.runtime" },
  ["monarch.collective"] = { "monarch.tensor" },
  ["monarch.gpu"] = { "monarch.tensor", "monarch.collective" },
  ["monarch.actor"] = {},
  ["monarch.persist"] = { "monarch.tensor" },
  ["monarch.status"] = { "monarch.persist" },
  ["monarch.top"] = { "monarch.persist", "monarch.status" },
  ["monarch.jupyter"] = { "monarch.jupyter_display" },
  ["monarch.train_recover"] = { "monarch.train_ckpt" },
  ["monarch.train"] = { "monarch.train_opts", "monarch.train_progress", "monarch.train_state", "monarch.train_ckpt",
    "monarch.train_recover" },
  ["monarch.launch_ray"] = { "monarch.join" },
}

-- Files that run inside the procs (lua/monarch/proc/): a world of their own, which requires none of
-- the controller's modules.
local PROC_RANKS = { ["monarch.proc.actor_host"] = 1 }

-- ---- reading the sources -------------------------------------------------------------

-- The line without its comment (a "--" outside a string), or "" for a comment line.
local function code_of(line)
  local quote, i, n = nil, 1, #line
  while i <= n do
    local c = line:sub(i, i)
    if quote then
      if c == "\\" then i = i + 1 elseif c == quote then quote = nil end
    elseif c == '"' or c == "'" then
      quote = c
    elseif line:sub(i, i + 1) == "--" then
      return line:sub(1, i - 1)
    end
    i = i + 1
  end
  return line
end

-- Every literal require of a module: { {name, line number}, ... }, and the locals bound to one.
local function scan(src)
  local reqs, locals, lines = {}, {}, {}
  local n = 0
  for line in (src .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    local code = code_of(line)
    lines[n] = code
    for name in code:gmatch("require%s*%(?%s*[\"']([%w_%.]+)[\"']") do reqs[#reqs + 1] = { name, n } end
    local var, name = code:match("^%s*local%s+([%w_]+)%s*=%s*require%s*%(?%s*[\"']([%w_%.]+)[\"']")
    if var then locals[var] = name end
  end
  return reqs, locals, lines
end

-- The assignments of a function onto another module's table in lines: X.f = function, function X.f(),
-- X.f = a_local_function, require("m").f = function (X a local bound to a require).
local function overwrites(lines, locals)
  local fns, out = {}, {}
  for _, code in ipairs(lines) do
    local f = code:match("^%s*local%s+function%s+([%w_]+)") or code:match("^%s*local%s+([%w_]+)%s*=%s*function")
    if f then fns[f] = true end
  end
  for n, code in ipairs(lines) do
    local x, f, rhs = code:match("^%s*([%w_]+)%.([%w_]+)%s*=%s*([%w_]+)")
    if not x then x, f = code:match("^%s*function%s+([%w_]+)%.([%w_]+)%s*%(") rhs = "function" end
    if x and locals[x] and (rhs == "function" or fns[rhs]) then
      out[#out + 1] = string.format("line %d assigns a function to %s.%s (%s)", n, x, f, locals[x])
    end
    local m, g = code:match("require%s*%(%s*[\"']([%w_%.]+)[\"']%s*%)%.([%w_]+)%s*=%s*function")
    if m then out[#out + 1] = string.format("line %d assigns a function to %s.%s", n, m, g) end
  end
  return out
end

--- The problems of a set of sources: files = { [module name] = source text }; ranks and siblings as
-- RANKS and SIBLINGS; ours(name): whether a required name is one of these Lua modules (the C ones,
-- monarch.core and the like, sit below every rank).
local function check(files, ranks, siblings, ours)
  local problems = {}
  local function say(...) problems[#problems + 1] = string.format(...) end
  for mod, src in pairs(files) do
    local r = ranks[mod]
    if not r then
      say("%s has no rank (give it one in tests/lua/ranks_spec.lua and docs/architecture.md)", mod)
    else
      local reqs, locals, lines = scan(src)
      for _, q in ipairs(reqs) do
        local name, line = q[1], q[2]
        if ours(name) then
          local rq = ranks[name]
          local sib = false
          for _, s in ipairs(siblings[mod] or {}) do sib = sib or s == name end
          if rq == nil then
            say("%s:%d requires %s, which has no rank here", mod, line, name)
          elseif rq > r or (rq == r and not sib) then
            say("%s (rank %d) requires %s (rank %d) at line %d", mod, r, name, rq, line)
          end
        end
      end
      for _, o in ipairs(overwrites(lines, locals)) do say("%s: %s", mod, o) end
    end
  end
  -- The sibling edges are an order: no cycle among them.
  local state = {}
  local function visit(m, path)
    if state[m] == "done" then return end
    if state[m] == "open" then return say("the siblings of rank %d form a cycle: %s", ranks[m] or 0, path .. " -> " .. m) end
    state[m] = "open"
    for _, s in ipairs(siblings[m] or {}) do visit(s, path and (path .. " -> " .. m) or m) end
    state[m] = "done"
  end
  for m in pairs(siblings) do visit(m, nil) end
  table.sort(problems)
  return problems
end

local lfs = require "lfs"

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- { [module name] = source } of the .lua files in dir, named prefix .. file name.
local function sources(dir, prefix)
  local out = {}
  for file in lfs.dir(dir) do
    local base = file:match("^(.+)%.lua$")
    if base then out[base == "init" and "monarch" or (prefix .. base)] = read(dir .. "/" .. file) end
  end
  return out
end

local controller = sources("lua/monarch", "monarch.")
local in_procs = sources("lua/monarch/proc", "monarch.proc.")
local function ours(name) return controller[name] ~= nil or in_procs[name] ~= nil end

describe("the ranks of the Lua modules", function()
  it("give every module of lua/monarch a rank, and no rank to a module that is gone", function()
    for mod in pairs(controller) do assert.is_not_nil(RANKS[mod], mod .. " has no rank") end
    for mod in pairs(RANKS) do assert.is_not_nil(controller[mod], mod .. " has a rank but no file") end
    for _, r in pairs(RANKS) do assert.is_not_nil(TIERS[r]) end
  end)

  it("hold: each module requires only lower ranks (or an allowed sibling) and replaces no function", function()
    assert.are.same({}, check(controller, RANKS, SIBLINGS, ours))
  end)

  it("hold for the files that run inside the procs: they require none of the controller's modules", function()
    local ranks = {}
    for k, v in pairs(PROC_RANKS) do ranks[k] = v end
    for k in pairs(controller) do ranks[k] = math.huge end -- above everything in the procs
    assert.are.same({}, check(in_procs, ranks, {}, ours))
  end)

  it("leave a mesh's list of procs to monarch.mesh: the others call mesh:proc_list()", function()
    for mod, src in pairs(controller) do
      if mod ~= "monarch.mesh" then
        local _, _, lines = scan(src)
        for n, code in ipairs(lines) do
          assert.is_nil(code:match("[%w_%)%]]%._procs%f[^%w_]"), string.format("%s:%d reads ._procs", mod, n))
        end
      end
    end
  end)

  describe("the check", function()
    local ranks = { ["m.low"] = 1, ["m.high"] = 2, ["m.mid_a"] = 2, ["m.mid_b"] = 2 }
    local function is_ours(name) return ranks[name] ~= nil end

    it("fails a module that requires a higher rank, even lazily or after code on the line", function()
      local p = check({ ["m.low"] = 'local x = 1; local h = require("m.high")\n' }, ranks, {}, is_ours)
      assert.are.same({ "m.low (rank 1) requires m.high (rank 2) at line 1" }, p)
      p = check({ ["m.low"] = 'local function f() return require "m.high" end\n' }, ranks, {}, is_ours)
      assert.are.equal(1, #p)
    end)

    it("fails a require of the same rank unless the sibling is allowed, and a cycle of siblings", function()
      local src = { ["m.mid_a"] = 'local b = require "m.mid_b"\n' }
      assert.are.equal(1, #check(src, ranks, {}, is_ours))
      assert.are.same({}, check(src, ranks, { ["m.mid_a"] = { "m.mid_b" } }, is_ours))
      local p = check(src, ranks, { ["m.mid_a"] = { "m.mid_b" }, ["m.mid_b"] = { "m.mid_a" } }, is_ours)
      assert.matches("form a cycle", p[1])
    end)

    it("passes a require in a comment and a module of C (not ours)", function()
      local src = { ["m.low"] = '-- require "m.high"\nlocal core = require "m.core" -- require("m.high")\n' }
      assert.are.same({}, check(src, ranks, {}, is_ours))
    end)

    it("fails a module that assigns a function onto another's table", function()
      local p = check({ ["m.high"] = 'local low = require "m.low"\nlow.pump = function() end\n' }, ranks, {}, is_ours)
      assert.are.same({ "m.high: line 2 assigns a function to low.pump (m.low)" }, p)
      p = check({ ["m.high"] = 'local low = require "m.low"\nfunction low.flush() end\n' }, ranks, {}, is_ours)
      assert.are.equal(1, #p)
      p = check({ ["m.high"] = 'local low = require "m.low"\nlocal function pump() end\nlow.pump = pump\n' }, ranks, {},
        is_ours)
      assert.are.equal(1, #p)
      p = check({ ["m.high"] = 'require("m.low").on_hung = function() end\n' }, ranks, {}, is_ours)
      assert.are.equal(1, #p)
    end)

    it("passes settings a module assigns to another's table", function()
      local src = { ["m.high"] = 'local low = require "m.low"\nlow.timeout = 3\nlow.hooks.x[1] = function() end\n' }
      assert.are.same({}, check(src, ranks, {}, is_ours))
    end)

    it("fails a module with no rank", function()
      assert.are.equal(1, #check({ ["m.new"] = "" }, ranks, {}, is_ours))
    end)
  end)
end)
