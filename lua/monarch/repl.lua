--- monarch.repl: the interactive loop of `monarch-run -i`.
-- Each line is Lua, run at once against the live cluster. An expression
-- prints its value (ValueMesh by coordinates, Future as pending or ready);
-- an unfinished chunk (a function being defined) continues on the next line.
-- Tab completes global names, monarch functions and the fields and methods
-- of what is before a `.` or `:`. Ctrl-C stops the wait in progress (a
-- fut:get(), a spawn) and leaves the cluster alone; Ctrl-D or exit() leaves.
-- Failures that happen while the prompt waits are shown at the next prompt.
-- monarch-run calls start() before the script (if any) and run() after it.
local core = require "monarch.core"
local errors = require "monarch.errors"
local runtime = require "monarch.runtime"
local future = require "monarch.future"
local persist = require "monarch.persist"

local M = {}
M.PROMPT = "monarch> "
M.CONTINUE = "    ...> " -- prompt for the next line of an unfinished chunk
M.EXIT_WAIT = 2           -- seconds exit waits for calls in flight before leaving them
M.WIDTH = 80              -- columns of a completion listing
local MAX_SHOW_ITEMS = 20 -- entries shown of a plain table
local MAX_SHOW_DEPTH = 3  -- levels of nested tables shown

local KEYWORDS = { "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if", "in",
  "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while" }

local started        -- start() has run
local idling         -- the prompt's own turns of the loop (idle): no Ctrl-C check there
local exit_deadline  -- while leaving: when to stop waiting for calls in flight
local pending = {}   -- failures seen while the prompt waited, shown at the next one

-- ---- compiling and showing ----------------------------------------------------

--- Compiles a chunk typed at the prompt. Returns fn and whether it is an
-- expression (tried first, as "return " .. src, so that it prints), or nil
-- and "incomplete" when more lines are needed, or nil and the syntax error.
function M.compile(src)
  local fn = loadstring("return " .. src, "=stdin")
  if fn then return fn, true end
  local err
  fn, err = loadstring(src, "=stdin")
  if fn then return fn, false end
  -- Like lua.c: a chunk that ends where more was expected is not finished yet.
  if err:sub(-7) == "'<eof>'" then return nil, "incomplete" end
  return nil, err
end

local function is_ident(k) return type(k) == "string" and k:match("^[%a_][%w_]*$") ~= nil end

--- One value as the REPL prints it: strings as they are, plain tables
-- inline ({1, 2, x = 3}), anything with __tostring through it.
function M.show(v, depth, nested)
  depth = depth or 0
  if type(v) == "string" then return nested and string.format("%q", v) or v end
  if type(v) ~= "table" then return tostring(v) end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return tostring(v) end
  if depth >= MAX_SHOW_DEPTH then return "{...}" end
  local parts, n = {}, #v
  for i = 1, math.min(n, MAX_SHOW_ITEMS) do parts[#parts + 1] = M.show(v[i], depth + 1, true) end
  local keys = {}
  for k in pairs(v) do
    if not (type(k) == "number" and k >= 1 and k <= n and k == math.floor(k)) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    if #parts >= MAX_SHOW_ITEMS then
      parts[#parts + 1] = "..."
      break
    end
    local ks = is_ident(k) and k or ("[" .. M.show(k, MAX_SHOW_DEPTH, true) .. "]")
    parts[#parts + 1] = ks .. " = " .. M.show(v[k], depth + 1, true)
  end
  if n > MAX_SHOW_ITEMS and #keys == 0 then parts[#parts + 1] = "..." end
  return "{" .. table.concat(parts, ", ") .. "}"
end

--- The text of an error as the REPL prints it.
function M.describe_error(e)
  if errors.is(e) then return tostring(e) end
  return "error: " .. tostring(e)
end

-- ---- completion ----------------------------------------------------------------

-- The value at a dotted path ("monarch.runtime") in env, without calling
-- anything but __index; nil if any step fails.
local function resolve(path, env)
  local v = env
  for part in path:gmatch("[^.]+") do
    local t = type(v)
    if t ~= "table" and t ~= "string" and t ~= "userdata" then return nil end
    local ok, x = pcall(function() return v[part] end)
    if not ok then return nil end
    v = x
  end
  return v
end

-- Names reachable from v: its own string keys and those of the __index
-- tables of its metatables (methods); only functions when methods_only.
local function fields(v, methods_only)
  local out, seen = {}, {}
  local t, hops = v, 0
  while t ~= nil and hops < 8 do
    if type(t) == "table" then
      for k, x in pairs(t) do
        if is_ident(k) and not seen[k] and (not methods_only or type(x) == "function") then
          seen[k] = true
          out[#out + 1] = k
        end
      end
    end
    local mt = getmetatable(t)
    local idx = type(mt) == "table" and rawget(mt, "__index")
    if type(idx) ~= "table" then break end
    t, hops = idx, hops + 1
  end
  return out
end

--- The completions of `word` (the text before the cursor) in env: a sorted
-- list of whole words. "pro" gives globals and keywords, "monarch.ho" the
-- fields of monarch, "procs:ca" the methods of procs. Names that start with
-- "_" only when the word does.
function M.candidates(word, env)
  env = env or _G
  local base, sep, part = word:match("^(.*)([.:])([%w_]*)$")
  local names, prefix
  if base then
    if not base:match("^[%a_][%w_]*$") and not base:match("^[%a_][%w_.]*[%w_]$") then return {} end
    if base:find("..", 1, true) then return {} end
    local v = resolve(base, env)
    if v == nil then return {} end
    names, prefix = fields(v, sep == ":"), base .. sep
  else
    part, prefix = word, ""
    if word ~= "" and not is_ident(word) then return {} end
    names = fields(env, false)
    for _, k in ipairs(KEYWORDS) do names[#names + 1] = k end
  end
  local out, seen = {}, {}
  local private = part:sub(1, 1) == "_"
  for _, n in ipairs(names) do
    if not seen[n] and n:sub(1, #part) == part and (private or n:sub(1, 1) ~= "_") then
      seen[n] = true
      out[#out + 1] = prefix .. n
    end
  end
  table.sort(out)
  return out
end

--- Lays out completions in columns, each shown without the part before
-- its last "." or ":".
function M.columns(cands, width)
  local shown, wide = {}, 0
  for i, c in ipairs(cands) do
    shown[i] = c:match("[.:]([^.:]*)$") or c
    wide = math.max(wide, #shown[i])
  end
  local per_row = math.max(1, math.floor((width or M.WIDTH) / (wide + 2)))
  local rows = math.ceil(#shown / per_row)
  local lines = {}
  for r = 1, rows do
    local cells = {}
    for col = 0, per_row - 1 do
      local s = shown[col * rows + r]
      if s then cells[#cells + 1] = s .. string.rep(" ", wide + 2 - #s) end
    end
    lines[r] = table.concat(cells):gsub("%s+$", "")
  end
  return table.concat(lines, "\n")
end

--- What Tab does with `word`: returns the text to insert (the part all
-- completions share beyond the word), or when there is none and several
-- fit, nil and a listing of them.
function M.complete(word, env)
  local cands = M.candidates(word, env)
  if #cands == 0 then return nil, nil end
  local common = cands[1]
  for i = 2, #cands do
    local c, n = cands[i], 0
    while n < #common and n < #c and common:byte(n + 1) == c:byte(n + 1) do n = n + 1 end
    common = common:sub(1, n)
  end
  local insert = common:sub(#word + 1)
  if insert ~= "" or #cands == 1 then return insert, nil end
  local cols = tonumber(os.getenv("COLUMNS") or "")
  return nil, M.columns(cands, cols)
end

-- ---- help ----------------------------------------------------------------------

M.HELP = [[
monarch REPL: Lua with the monarch library, against a live cluster.
  hosts                                 the HostMesh (monarch.hosts())
  procs = hosts:spawn_procs{procs = 4}  spawn a ProcMesh on every host
  procs:load "basic"                    load a kernel library on every proc
  procs:call("rank")                    a Future of a ValueMesh; :get() waits for it
  procs:call_one / choose / broadcast / stream / ping / slice{procs = 0}
  t = procs:tensor("f32", {1024})       a tensor on every proc; t:fetch():get()
  procs:persist("name", {t = t})        keep the procs (and name t) after you leave
  procs:detach()                        let go of a persistent mesh; it keeps running
  m = monarch.attach("name")            take a persistent mesh back (m.tensors.t)
  monarch.persistent()                  the persistent meshes the hosts keep
  top()                                 a live view of every host and proc; q quits
  procs:stop()                          end the procs
  help(x)                               the methods of x
  exit() or Ctrl-D                      leave (persistent meshes stay, others stop)
An expression prints its value. Tab completes names; Ctrl-C stops a wait
(the calls go on); history is kept in ~/.monarch_history. See docs/repl.md.]]

--- Prints the main commands, or with an argument the methods of x.
function M.help(x)
  if x == nil then
    print(M.HELP)
    return
  end
  local names = fields(x, true)
  local public = {}
  for _, n in ipairs(names) do
    if n:sub(1, 1) ~= "_" then public[#public + 1] = n end
  end
  table.sort(public)
  print(#public > 0 and M.columns(public, M.WIDTH) or ("no methods: " .. M.show(x)))
end

-- ---- waiting and interrupts ----------------------------------------------------

local function interrupted(what)
  return errors.new { kind = "interrupted", message = what and ("stopped waiting (Ctrl-C) and cancelled " .. what)
    or "stopped waiting (Ctrl-C); calls already sent go on" }
end

-- After every pump (runtime.hooks.after_pump): a Ctrl-C ends the wait that
-- pumps (Future:get, spawn_procs, ...) at a point where the runtime is
-- consistent: after an iteration. The call a get() waited for is cancelled,
-- so its procs stop it too.
local function after_pump()
  if idling then return end
  if core.interrupted() then
    local f = future.waiting
    future.waiting = nil
    if f and not f:done() then
      f:cancel()
      error(interrupted(f.what), 0)
    end
    error(interrupted(), 0)
  end
  if exit_deadline and runtime.now() > exit_deadline then
    exit_deadline = nil
    error(errors.new { kind = "interrupted", message = "left calls in flight unanswered" }, 0)
  end
end

-- While the prompt waits: turn the loop (heartbeats, restarts, results) and
-- keep the failures it raises for the next prompt. Returns true once procs'
-- output has been printed (monarch.log holds lines back for its window), so
-- that the line being typed is shown again below it.
local output_seen, refresh_at
local function idle()
  if not runtime.initialized then return false end
  local log = require "monarch.log"
  idling = true
  for _ = 1, 16 do
    local ok, err = pcall(runtime.pump, 0)
    if ok then break end
    pending[#pending + 1] = err
  end
  idling = false
  if log.last_output ~= output_seen then
    output_seen = log.last_output
    refresh_at = runtime.now() + (log.window or 0) + 0.01
  end
  if refresh_at and runtime.now() >= refresh_at then
    refresh_at = nil
    return true
  end
  return false
end

-- Before a prompt: what the loop has, procs' lines held back, then the failures.
local function show_pending()
  idle()
  require("monarch.log").flush()
  refresh_at = nil -- the prompt comes after all of it
  for _, e in ipairs(pending) do io.stderr:write(M.describe_error(e), "\n") end
  pending = {}
end

-- ---- evaluation ----------------------------------------------------------------

local function handler(e)
  if errors.is(e) then return e end
  local tb = debug.traceback(tostring(e), 2)
  -- The frames below the chunk are the REPL's own.
  return (tb:gsub("\n%s*%[C%]: in function 'xpcall'.*$", ""))
end

local function pack(...) return { n = select("#", ...), ... } end

--- Runs a compiled chunk and prints its values (or its error).
function M.eval(fn)
  future.waiting = nil -- a wait an earlier line left by raising is over
  local r = pack(xpcall(fn, handler))
  if not r[1] then
    -- After a Ctrl-C the terminal has echoed "^C" on the current line.
    local nl = errors.is(r[2]) and r[2].kind == "interrupted" and "\n" or ""
    io.stderr:write(nl, M.describe_error(r[2]), "\n")
    return false
  end
  if r.n > 1 then
    local out = {}
    for i = 2, r.n do out[#out + 1] = M.show(r[i]) end
    io.stdout:write(table.concat(out, "\t"), "\n")
  end
  io.stdout:flush()
  return true
end

-- ---- the loop ------------------------------------------------------------------

--- Sets the REPL up before anything runs: Ctrl-C stops waits instead of the
-- process, and the globals monarch, help, top and exit exist.
function M.start()
  if started then return end
  started = true
  local monarch = require "monarch"
  core.catch_interrupts(true)
  table.insert(runtime.hooks.after_pump, after_pump)
  rawset(_G, "monarch", monarch)
  rawset(_G, "help", M.help)
  rawset(_G, "top", monarch.top)
  rawset(_G, "exit", function(code)
    M.exit_code = code or 0
    M.leaving = true
  end)
end

local function history_path()
  local p = os.getenv("MONARCH_HISTORY")
  if p then return p ~= "" and p or nil end
  local home = os.getenv("HOME")
  return home and home ~= "" and (home .. "/.monarch_history") or nil
end

local function banner(monarch)
  if not monarch.config.quiet then
    print(string.format("monarch %s (%s): help() lists the commands, Ctrl-D leaves.", monarch._VERSION, jit and jit.version or _VERSION))
  end
  if rawget(_G, "hosts") == nil then
    local ok, h = xpcall(monarch.hosts, handler)
    if ok then
      rawset(_G, "hosts", h)
      if not monarch.config.quiet then print("hosts = " .. tostring(h)) end
    else
      io.stderr:write(M.describe_error(h), "\n")
    end
  end
end

--- Leaves: waits a little for calls in flight (Ctrl-C: not at all), says
-- which persistent meshes stay up, and shuts the rest of the cluster down.
-- Returns the exit status.
function M.finish()
  local monarch = require "monarch"
  for name, m in pairs(persist.meshes) do
    local n = 0
    for _, p in ipairs(m:proc_list()) do if p.state == "ready" or p.state == "reconnecting" then n = n + 1 end end
    if n > 0 then
      io.stderr:write(string.format("monarch: leaving persistent mesh '%s' running (%d procs); monarch.attach('%s') takes it back\n",
        name, n, name))
    end
  end
  if runtime.initialized then
    local s = runtime.stats()
    if s.calls_in_flight + s.tasks > 0 then
      io.stderr:write(string.format("monarch: waiting up to %gs for calls in flight (Ctrl-C leaves now)\n", M.EXIT_WAIT))
    end
    exit_deadline = runtime.now() + M.EXIT_WAIT
  end
  local ok, err = pcall(monarch.shutdown)
  exit_deadline = nil
  if not ok and not (errors.is(err) and err.kind == "interrupted") then
    io.stderr:write(M.describe_error(err), "\n")
  end
  core.catch_interrupts(false)
  return M.exit_code or 0
end

--- The loop: reads, runs and prints until Ctrl-D or exit(). Returns the exit status.
function M.run()
  M.start()
  local monarch = require "monarch"
  banner(monarch)
  local ed = require("monarch.lineedit").new(history_path())
  ed:set_completer(function(word)
    local ok, insert, listing = pcall(M.complete, word, _G)
    if ok then return insert, listing end
  end)
  local chunk -- lines of an unfinished chunk
  output_seen = require("monarch.log").last_output
  while not M.leaving do
    show_pending()
    local line = ed:readline(chunk and M.CONTINUE or M.PROMPT, idle)
    if line == nil then
      io.stdout:write("\n")
      break
    elseif line == false then
      io.stdout:write("\n") -- Ctrl-C: the line (and any unfinished chunk) is dropped
      chunk = nil
    else
      if line:match("%S") then ed:add_history(line) end
      local src = chunk and (chunk .. "\n" .. line) or line
      chunk = nil
      if src:match("%S") then
        local fn, err = M.compile(src)
        if fn then
          M.eval(fn)
        elseif err == "incomplete" then
          chunk = src
        else
          io.stderr:write(err, "\n")
        end
      end
    end
  end
  ed:close()
  return M.finish()
end

return M
