--- monarch.jupyter: `monarch-run --jupyter-kernel CONNECTION_FILE`, a
-- Jupyter kernel (messaging protocol 5.3) whose cells run in the same Lua
-- state, with the same conveniences, as the REPL (monarch.repl): an
-- expression's value is the cell's result, print and procs' output stream to
-- the cell as they come, errors show one line first, Tab completes and
-- Shift-Tab shows a function's comment. The controller's loop turns between
-- cells (the sockets wake it: host/cli/jupyter_lua.c), so heartbeats,
-- failures and on_host_loss handlers run while the user thinks; what they
-- print lands under the last cell. The stop button (interrupt_request, or
-- SIGINT) cancels the call a cell waits for, as Ctrl-C does in the REPL;
-- input() and io.read ask the front end for a line (the stdin channel).
-- Also `monarch-run --install-kernel [--user | --prefix P]` (M.install).
local cjson = require "cjson"
local ffi = require "ffi"
local core = require "monarch.core"
local errors = require "monarch.errors"
local future = require "monarch.future"
local repl = require "monarch.repl"
local runtime = require "monarch.runtime"
local show = require "monarch.jupyter_display"

local M = {}
M.PROTOCOL = "5.3"
M.FLUSH_BYTES = 64 * 1024 -- a stream's buffered text sent at once past this size
M.FLUSH_S = 0.05          -- and at least this often while a cell runs (also at every pump)
M.IDLE_MS = 250           -- longest wait for a message when there is no controller loop to wait in
M.KERNEL_NAME = "monarch" -- the kernelspec's directory name

local k             -- the wire (monarch.jupyter_wire), while the kernel runs
local session       -- this kernel's session id
local counter = 0   -- messages sent, for their ids
local count = 0     -- execution_count
local in_cell       -- the request of the cell that runs, or nil
local last_parent = "{}" -- the header (JSON) output between cells is shown under
local leaving       -- a shutdown_request was answered
local pending = {}  -- failures seen between cells, shown at the start of the next
local real_stderr = io.stderr
local EMPTY = "\0monarch-empty-array\0" -- cjson makes {} of an empty table: this string becomes []

local function log(fmt, ...) real_stderr:write("monarch-run: ", string.format(fmt, ...), "\n") end

-- ---- messages ------------------------------------------------------------------

-- Replaces bytes that are not UTF-8 (a proc's binary output, a value's bytes) by "?": the protocol's JSON
-- is UTF-8, and a front end that cannot decode a message loses it (jupyter_client logs an error).
local function clean(s)
  if not s:find("[\128-\255]") then return s end
  local out, i, n = {}, 1, #s
  while i <= n do
    local c = s:byte(i)
    local len = c < 0x80 and 1 or c >= 0xC2 and c < 0xE0 and 2 or c >= 0xE0 and c < 0xF0 and 3 or
      c >= 0xF0 and c < 0xF5 and 4 or 0
    local ok = len > 0 and i + len - 1 <= n
    for j = i + 1, i + len - 1 do
      if ok then
        local b = s:byte(j)
        ok = b >= 0x80 and b < 0xC0
      end
    end
    if ok then
      out[#out + 1] = s:sub(i, i + len - 1)
      i = i + len
    else
      out[#out + 1] = "?"
      i = i + 1
    end
  end
  return table.concat(out)
end

local function encode(t)
  local s = cjson.encode(t)
  if s:find("\\u0000monarch-empty-array\\u0000", 1, true) then
    s = s:gsub('"\\u0000monarch%-empty%-array\\u0000"', "[]")
  end
  return s
end

-- A header as JSON, formatted rather than encoded (a cell sends five: cjson's table walk was most
-- of a status message's cost). Every field is plain ASCII: the session is alphanumeric
-- (core.generate_token), msg_type one of ours.
local HEADER = '{"msg_id":"%s-%d","session":"%s","username":"monarch","date":"%s","msg_type":"%s","version":"'
  .. M.PROTOCOL .. '"}'
local function header(msg_type)
  counter = counter + 1
  return string.format(HEADER, session, counter, session, os.date("!%Y-%m-%dT%H:%M:%S.000000Z"), msg_type)
end

--- Sends one message: on iopub (idents nil) or as a reply to the
-- identities of a request; parent is the request's header as it came.
-- Every text in it is made UTF-8 (clean); false when it could not be sent.
local function send(channel, idents, msg_type, parent, content)
  local okj, body = pcall(encode, content)
  if not okj then
    log("cannot send a %s: %s", msg_type, tostring(body))
    return false
  end
  local ok, err = k:send(channel, idents or { "kernel." .. session .. "." .. msg_type }, header(msg_type),
    parent or "{}", "{}", clean(body))
  if not ok then log("%s", err) end
  return ok
end

local function publish(msg_type, content, parent) send("iopub", nil, msg_type, parent or last_parent, content) end

local function reply(req, msg_type, content)
  req.replied = true
  send(req.channel, req.idents, msg_type, req.header_raw, content)
end

-- ---- output --------------------------------------------------------------------

local streams = { stdout = {}, stderr = {} } -- name -> buffered parts
local bytes, since, sent = 0, 0, 0 -- bytes buffered, since when, when text was last sent

--- Sends what a stream has buffered.
local function flush_stream(name)
  local b = streams[name]
  if #b == 0 then return end
  local text = table.concat(b)
  streams[name] = {}
  sent = runtime.now()
  publish("stream", { name = name, text = text })
end

local function flush_all()
  flush_stream("stdout")
  flush_stream("stderr")
end

-- Text is held at most FLUSH_S, to send many lines in one message; the first text after a quiet
-- spell goes at once, so that a line printed before a long computation (no pump, no later write to
-- send it) is seen while the cell computes.
local function write(name, s)
  local b = streams[name]
  if #b == 0 and #streams.stdout + #streams.stderr == 0 then
    bytes, since = 0, runtime.now()
    if since - sent >= M.FLUSH_S then since = since - M.FLUSH_S end
  end
  -- Another stream's text first, so that the two keep their order in the cell.
  local other = name == "stdout" and "stderr" or "stdout"
  if #streams[other] > 0 then flush_stream(other) end
  b[#b + 1] = s
  bytes = bytes + #s
  if bytes >= M.FLUSH_BYTES or runtime.now() - since >= M.FLUSH_S then
    flush_stream(name)
    bytes, since = 0, runtime.now()
  end
end

-- A file-like object for io.stdout and io.stderr. Not a cell's value (`io.write("x")` returns it).
local StreamFile = { __tostring = function(f) return "file (" .. f.name .. ", to the notebook)" end }
StreamFile.__index = StreamFile
local function stream_file(name)
  local f = setmetatable({ name = name }, StreamFile)
  function f:write(...)
    for i = 1, select("#", ...) do write(name, tostring((select(i, ...)))) end
    return self
  end
  function f:flush() flush_stream(name) return self end
  function f:setvbuf() return true end
  function f:close() return true end
  return f
end

-- ---- input ---------------------------------------------------------------------

-- The input_reply to our input_request, from the stdin channel; nil while none has come.
local function input_reply()
  local idents, hdr, _, _, content, signed = k:recv("stdin")
  if idents == nil then
    if hdr ~= nil then log("ignored %s", hdr) end
    return nil
  end
  local ok1, h = pcall(cjson.decode, hdr)
  local ok2, c = pcall(cjson.decode, content)
  if not signed or not (ok1 and ok2 and type(h) == "table" and h.msg_type == "input_reply" and type(c) == "table") then
    log("ignored a message on the stdin channel that is not a signed input_reply")
    return nil
  end
  return type(c.value) == "string" and c.value or ""
end

--- A line typed in the front end: an input_request on the stdin channel to
-- the front end of the cell that runs, answered by its input_reply (as
-- Python's input() in ipykernel). The stop button ends the wait; the
-- cluster's loop turns meanwhile.
local function read_line(prompt, password)
  local req = in_cell
  if not req then error("io.read: no cell is running", 0) end
  if req.content.allow_stdin ~= true then
    error("io.read: this front end does not take input for the cell (its allow_stdin is false)", 0)
  end
  flush_all()
  send("stdin", req.idents, "input_request", req.header_raw, { prompt = prompt or "", password = password == true })
  while true do
    local line = input_reply()
    if line then return line end
    if leaving then error(errors.new { kind = "interrupted", message = "the kernel is stopping" }, 0) end
    if runtime.initialized then runtime.pump(0.02) -- the stop button raises here (monarch.repl's hook)
    else
      k:wait(20)
      if core.interrupted() then error(errors.new { kind = "interrupted", message = "stopped waiting for input" }, 0) end
    end
  end
end

-- io.read's formats on a typed line: "l"/"*l" (the default), "L", "n", "a", or a count of bytes.
local function read_formats(...)
  local n = select("#", ...)
  local out = {}
  for i = 1, math.max(n, 1) do
    local f = (select(i, ...))
    f = type(f) == "string" and f:gsub("^%*", "") or f or "l"
    local line = read_line("")
    if f == "l" or f == "a" then out[i] = line
    elseif f == "L" then out[i] = line .. "\n"
    elseif f == "n" then out[i] = tonumber(line)
    elseif type(f) == "number" then out[i] = line:sub(1, f)
    else error("io.read: bad format '" .. tostring(f) .. "' (l, L, n, a or a number)", 0) end
  end
  return unpack(out, 1, math.max(n, 1))
end

--- input([prompt [, password]]): a line typed in the front end (io.read
-- without a prompt); password hides what is typed.
function M.input(prompt, password) return read_line(prompt and tostring(prompt) or "", password) end

-- print, io.write, io.stdout and io.stderr go to the notebook (the process's own stdout is the server's log).
local function redirect()
  local out, err = stream_file("stdout"), stream_file("stderr")
  io.stdout, io.stderr = out, err
  local output, current = io.output, out
  io.output = function(f) -- io.output() is the notebook's stdout until a cell names a file
    if f ~= nil then current = (f == out or f == io.stdout) and out or output(f) end
    return current
  end
  io.write = function(...) return current:write(...) end
  io.read = read_formats
  io.stdin = setmetatable({ read = function(_, ...) return read_formats(...) end,
    lines = function() return function() return read_line("") end end, close = function() return true end },
    { __tostring = function() return "file (stdin, from the notebook)" end })
  rawset(_G, "print", function(...)
    local n = select("#", ...)
    local parts = {}
    for i = 1, n do parts[i] = tostring((select(i, ...))) end
    write("stdout", table.concat(parts, "\t") .. "\n")
  end)
end

local Display = { __tostring = function(h) return "display " .. h.id end }
Display.__index = Display
local displays = 0

local function bundle_of(x) return type(x) == "table" and x["text/plain"] and getmetatable(x) == nil and x or show.bundle(x) end

function Display:update(x)
  flush_all()
  publish("update_display_data", { data = bundle_of(x), metadata = {}, transient = { display_id = self.id } })
end

--- display(x [, opts]): shows x in the cell now (a plot's SVG, a table,
-- any value as the REPL prints it); returns a handle whose :update(y)
-- replaces the picture in place (update_display_data). A cell's returned
-- value is shown this way without display(). opts.id: the display's id.
function M.display(x, opts)
  displays = displays + 1
  local h = setmetatable({ id = (opts and opts.id) or (session .. "-display-" .. displays) }, Display)
  flush_all()
  publish("display_data", { data = bundle_of(x), metadata = {}, transient = { display_id = h.id } })
  return h
end

-- ---- handlers ------------------------------------------------------------------

local H = {}

function H.kernel_info_request(req)
  reply(req, "kernel_info_reply", {
    status = "ok", protocol_version = M.PROTOCOL, implementation = "monarch", implementation_version = core.version,
    language_info = { name = "lua", version = jit and jit.version or _VERSION, mimetype = "text/x-lua",
      file_extension = ".lua", pygments_lexer = "lua", codemirror_mode = "lua" },
    banner = string.format("monarch %s (%s): Lua against a live cluster; help() lists the commands", core.version,
      jit and jit.version or _VERSION),
    help_links = EMPTY,
  })
end

local function pack(...) return { n = select("#", ...), ... } end

local frames = "" -- the stack of the last MonarchError raised in a cell (the error is a table: no room in it)
local function handler(e)
  if errors.is(e) then
    frames = debug.traceback("", 2):gsub("\n%s*%[C%]: in function 'xpcall'.*$", "")
    return e
  end
  local ok, text = pcall(tostring, e)
  if not ok then text = "(an error value that cannot be shown: " .. tostring(text) .. ")" end
  return (debug.traceback(text, 2):gsub("\n%s*%[C%]: in function 'xpcall'.*$", ""))
end

--- Compiles a cell: as one expression, else as statements and a last line
-- that is an expression (the cell's value: `procs:load "basic"` then
-- `procs`, or a call such as `math.max(x, 2)`), else as statements. The
-- last line counts only when it and the lines above it are each complete,
-- so that `return` never lands inside a block. Returns fn, or nil and
-- "incomplete" or the syntax error.
function M.compile(code)
  local fn = loadstring("return " .. code, "=stdin")
  if fn then return fn end
  local head, last = code:match("^(.*\n)([^\n]*%S[^\n]*)%s*$")
  if head and loadstring("return " .. last) and loadstring(head) then
    fn = loadstring(head .. "return " .. last, "=stdin")
    if fn then return fn end
  end
  fn = repl.compile(code)
  if fn then return fn end
  return nil, select(2, repl.compile(code))
end

-- Runs the cell's code; returns ok and the values, or false and the error.
local function run_code(code)
  local fn, err = M.compile(code)
  if not fn then
    return false, err == "incomplete" and "syntax error: the cell ends in the middle of a statement" or err
  end
  local r = pack(xpcall(fn, handler))
  if not r[1] then return false, r[2] end
  return true, r
end

-- What is not shown as a cell's value: what display() and io.write return.
local function quiet(r)
  for i = 2, r.n do
    local mt = getmetatable(r[i])
    if mt ~= Display and mt ~= StreamFile then return false end
  end
  return true
end

-- The execute_reply's user_expressions: each expression's value as a bundle, or its error.
local function user_expressions(exprs)
  local out = {}
  for name, code in pairs(type(exprs) == "table" and exprs or {}) do
    local fn, err = loadstring("return " .. tostring(code), "=" .. tostring(name))
    local r = fn and pack(xpcall(fn, handler)) or { false, err }
    local ok, data = r[1], nil
    if ok then ok, data = pcall(show.result, r) else data = r[2] end
    if ok then out[tostring(name)] = { status = "ok", data = data, metadata = {} }
    else
      local ename, evalue, tb = show.error_parts(data, frames)
      out[tostring(name)] = { status = "error", ename = ename, evalue = evalue, traceback = tb }
    end
  end
  return out
end

local function cell_error(req, e)
  local ename, evalue, tb = show.error_parts(e, frames)
  publish("error", { ename = ename, evalue = evalue, traceback = tb })
  reply(req, "execute_reply", { status = "error", execution_count = count, ename = ename, evalue = evalue,
    traceback = tb })
end

function H.execute_request(req)
  local c = req.content
  local silent = c.silent == true
  if not silent and c.store_history ~= false then count = count + 1 end
  last_parent = req.header_raw
  if not silent then publish("execute_input", { code = c.code, execution_count = count }) end
  for _, e in ipairs(pending) do write("stderr", repl.describe_error(e) .. "\n") end
  pending = {}
  core.interrupted() -- a stop pressed between cells is stale
  future.waiting = nil
  in_cell = req
  local ok, r = run_code(type(c.code) == "string" and c.code or "")
  in_cell = nil
  require("monarch.log").flush() -- the procs' lines of this cell, held for their window
  flush_all()
  if not ok then return cell_error(req, r) end
  if r.n > 1 and not silent and not quiet(r) then
    local shown, data = pcall(show.result, r) -- a value's __tostring may fail
    if not shown then return cell_error(req, "the cell's value cannot be shown: " .. tostring(data)) end
    publish("execute_result", { execution_count = count, data = data, metadata = {} })
  end
  reply(req, "execute_reply", { status = "ok", execution_count = count,
    user_expressions = user_expressions(c.user_expressions), payload = EMPTY })
end

-- Byte offset in s of unicode code point position pos (the protocol counts code points).
local function byte_at(s, pos)
  local i, n = 0, 0
  while n < pos and i < #s do
    i = i + 1
    local b = s:byte(i)
    if b < 0x80 or b >= 0xC0 then n = n + 1 end
    while i < #s and s:byte(i + 1) >= 0x80 and s:byte(i + 1) < 0xC0 do i = i + 1 end
  end
  return i
end

-- The word (a name, a dotted or `:` path) that ends at byte `at` of code, and where it starts.
local function word_before(code, at)
  local start = at
  while start > 0 and code:sub(start, start):match("[%w_.:]") do start = start - 1 end
  return code:sub(start + 1, at), start
end

-- The request's code and cursor: a whole number of code points within the code (the end when
-- absent, not a number, or NaN), and its byte offset.
local function code_and_cursor(c)
  local code = type(c.code) == "string" and c.code or ""
  local len = select(2, code:gsub("[^\128-\191]", "")) -- code points: the bytes that start one
  local pos = c.cursor_pos
  if type(pos) ~= "number" or pos ~= pos then pos = len end
  pos = math.max(0, math.min(len, math.floor(pos)))
  return code, byte_at(code, pos), pos
end

function H.complete_request(req)
  local code, at, pos = code_and_cursor(req.content)
  local word = word_before(code, at)
  local ok, cands = pcall(repl.candidates, word, _G)
  local matches = ok and cands or {}
  -- The front end replaces the text from cursor_start: each match is the whole word.
  reply(req, "complete_reply", { status = "ok", matches = #matches > 0 and matches or EMPTY,
    cursor_start = pos - #word, cursor_end = pos, metadata = {} })
end

function H.inspect_request(req)
  local code, at = code_and_cursor(req.content)
  local j = at
  while j < #code and code:sub(j + 1, j + 1):match("[%w_]") do j = j + 1 end -- the whole name under the cursor
  local name = word_before(code, j):gsub("[.:]$", "")
  local ok, text = pcall(show.inspect, name, _G)
  local found = ok and text ~= nil
  reply(req, "inspect_reply", { status = "ok", found = found, data = found and { ["text/plain"] = text } or {},
    metadata = {} })
end

function H.is_complete_request(req)
  local code = type(req.content.code) == "string" and req.content.code or ""
  local fn, err = M.compile(code)
  local status = fn and "complete" or err == "incomplete" and "incomplete" or "invalid"
  reply(req, "is_complete_reply", { status = status, indent = status == "incomplete" and "  " or "" })
end

function H.comm_info_request(req) reply(req, "comm_info_reply", { status = "ok", comms = {} }) end

function H.history_request(req) reply(req, "history_reply", { status = "ok", history = EMPTY }) end

function H.interrupt_request(req)
  reply(req, "interrupt_reply", { status = "ok" })
  if in_cell then require("monarch.jupyter_wire").interrupt() end
end

function H.shutdown_request(req)
  reply(req, "shutdown_reply", { status = "ok", restart = req.content.restart == true })
  leaving = true
  if in_cell then require("monarch.jupyter_wire").interrupt() end
end

-- ---- the loop ------------------------------------------------------------------

-- Runs a request's handler. One that fails (a bug, or input no check foresaw) is logged and
-- answered with an error reply; the kernel goes on.
local function handle(req)
  local t = req.header.msg_type
  local fn = H[t]
  if not fn then return log("ignored a %s on the %s channel (not handled)", t, req.channel) end
  if in_cell and t == "execute_request" then -- on control, while a cell runs: it would nest in the cell
    return reply(req, "execute_reply", { status = "error", execution_count = count, ename = "KernelBusy",
      evalue = "a cell is running: an execute_request on the control channel waits for it to end",
      traceback = { "error: a cell is running" } })
  end
  local cell = in_cell
  local ok, err = xpcall(fn, debug.traceback, req)
  if ok then return end
  in_cell = cell
  log("a %s failed: %s", t, tostring(err))
  if not req.replied then
    reply(req, (t:gsub("_request$", "_reply")), { status = "error", ename = "KernelError",
      evalue = t .. " failed in the kernel (its log says where)", traceback = { "error: " .. t .. " failed" } })
  end
end

-- The signatures of the last SEEN_MAX messages: one seen before is a message sent again (replayed),
-- refused as jupyter_client's Session refuses one. Not msg_ids: a front end's manager and client
-- may number theirs alike. Unsigned messages (no key) are not checked.
local seen, seen_order, seen_first, SEEN_MAX = {}, {}, 1, 10000
local function replayed(signature)
  if signature == "" then return false end
  if seen[signature] then return true end
  seen[signature] = true
  seen_order[#seen_order + 1] = signature
  if #seen_order - seen_first >= SEEN_MAX then
    seen[seen_order[seen_first]], seen_order[seen_first] = nil, nil
    seen_first = seen_first + 1
  end
  return false
end

-- Handles what one channel has, until it is empty (a ZMQ_FD wakes only on new traffic). While a
-- cell runs only control is read: the shell's requests wait their turn.
local function serve(channel)
  while not leaving do
    local idents, hdr, parent, meta, content, signed, signature = k:recv(channel)
    if idents == nil then
      if hdr == nil then return end
      log("ignored %s", hdr)
    elseif not signed then
      log("ignored a message with a bad signature on the %s channel", channel)
    else
      local ok1, h = pcall(cjson.decode, hdr)
      local ok2, c = pcall(cjson.decode, content)
      if not (ok1 and ok2 and type(h) == "table" and type(c) == "table" and type(h.msg_type) == "string") then
        log("ignored a message on the %s channel that is not JSON with a msg_type", channel)
      elseif replayed(signature) then
        log("ignored a %s on the %s channel: its signature was seen before (a replayed message)", h.msg_type, channel)
      else
        publish("status", { execution_state = "busy" }, hdr)
        handle({ channel = channel, idents = idents, header = h, header_raw = hdr, content = c })
        publish("status", { execution_state = "idle" }, hdr)
      end
    end
  end
end

-- The front end that started the kernel (JPY_PARENT_PID, which jupyter_client sets; as in
-- ipykernel, a kernel started without it is not watched): when it dies without a shutdown_request
-- (killed, crashed) the kernel stops as at a shutdown, rather than keep its meshes running for
-- nobody. Looked at once a second: gone when the pid is, or when it was our parent and no longer is.
pcall(ffi.cdef, "int getppid(void);") -- each alone: another module may have declared it
pcall(ffi.cdef, "int kill(int pid, int sig);")
local parent_pid, first_ppid, next_look = nil, nil, 0
local function front_end_gone()
  local now = runtime.now()
  if not parent_pid or now < next_look then return false end
  next_look = now + 1
  if first_ppid == parent_pid and ffi.C.getppid() ~= parent_pid then return true end
  return ffi.C.kill(parent_pid, 0) ~= 0 and ffi.errno() == 3 -- ESRCH
end

local function watch_front_end()
  if leaving or not front_end_gone() then return end
  log("the front end (pid %d) is gone: the kernel stops", parent_pid)
  leaving = true
  if in_cell then require("monarch.jupyter_wire").interrupt() end
end

-- After every pump (runtime.hooks.after_pump), before the REPL's: a cell's output goes out as it
-- comes, and control (interrupt, shutdown) is heard while the cell waits.
local function after_pump()
  if not in_cell then return end
  flush_all()
  serve("control")
  watch_front_end()
end

-- Between cells: one turn of the controller's loop (woken by our sockets) or, without one, a wait on them.
local function idle()
  if runtime.initialized and k:watch() then
    local ok, err = pcall(runtime.pump, nil)
    if not ok and not (errors.is(err) and err.kind == "interrupted") then write("stderr", repl.describe_error(err) .. "\n") end
  else
    k:wait(M.IDLE_MS)
  end
  flush_all()
  watch_front_end()
end

local function read_connection(path)
  local f, why = io.open(path, "r")
  if not f then return nil, "cannot read the connection file: " .. why end
  local text = f:read("*a")
  f:close()
  local ok, info = pcall(cjson.decode, text)
  if not ok or type(info) ~= "table" then return nil, path .. ": not a JSON object (a Jupyter connection file)" end
  return info
end

-- The globals of a notebook: the REPL's, display, and a top() that draws in the cell.
local function set_globals(monarch)
  rawset(_G, "display", M.display)
  rawset(_G, "input", M.input)
  -- Not tail calls, so that their argument errors name the cell's line; Shift-Tab shows the real ones' docs.
  local function top(opts)
    show.top(monarch, M.display, opts)
  end
  local function train_live(spec, args, every)
    local job = show.train_live(M.display, spec, args, every)
    return job
  end
  show.doc_for[top], show.doc_for[train_live] = show.top, show.train_live
  rawset(_G, "top", top)
  rawset(_G, "train_live", train_live)
  rawset(_G, "exit", function() error("exit: use the notebook's Kernel menu (shut down or restart)", 2) end)
  if rawget(_G, "hosts") == nil then
    local ok, h = xpcall(monarch.hosts, handler)
    if ok then rawset(_G, "hosts", h) else pending[#pending + 1] = h end
  end
end

--- Runs the kernel on the connection file until a shutdown_request; the
-- exit status. Meshes are stopped at the end, persistent ones excepted
-- (the notebook is told which stay).
function M.run(path)
  local info, why = read_connection(path)
  local ok, wire_or_err
  if info then ok, wire_or_err = pcall(require("monarch.jupyter_wire").open, info) end
  if not info or not ok then
    log("%s", info and tostring(wire_or_err) or why)
    return 2
  end
  k = wire_or_err
  session = core.generate_token():sub(1, 32)
  first_ppid, parent_pid = ffi.C.getppid(), tonumber(os.getenv("JPY_PARENT_PID") or "")
  if parent_pid and parent_pid <= 1 then parent_pid = nil end -- init never goes away
  repl.start()
  local monarch = require "monarch"
  table.insert(runtime.hooks.after_pump, 1, after_pump)
  redirect()
  set_globals(monarch)
  while not leaving do
    serve("control")
    serve("shell")
    if not leaving then idle() end
  end
  local code = repl.finish() -- says which persistent meshes stay, on stderr: the last cell's output
  flush_all()
  k:close()
  k = nil
  return code
end

-- ---- installing the kernelspec ---------------------------------------------------

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function copy(from, to)
  local a = io.open(from, "rb")
  if not a then return nil, "cannot read " .. from end
  local data = a:read("*a")
  a:close()
  local b, why = io.open(to, "wb")
  if not b then return nil, "cannot write " .. why end
  b:write(data)
  b:close()
  return true
end

--- `monarch-run [options] --install-kernel [--user | --prefix P]`: writes
-- the kernelspec "Monarch (Lua)" (kernel.json and its logos). before: the
-- options given before --install-kernel (--hosts ...), which the kernel is
-- started with. Returns the exit status; errors are one line on stderr.
function M.install(args, before)
  local prefix = core.prefix()
  local dest
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--user" then
      local data = os.getenv("JUPYTER_DATA_DIR")
      dest = (data and data ~= "" and data or ((os.getenv("HOME") or "") .. "/.local/share/jupyter")) .. "/kernels"
    elseif a == "--prefix" then
      if not args[i + 1] then log("--prefix needs a directory") return 2 end
      dest = args[i + 1] .. "/share/jupyter/kernels"
      i = i + 1
    else
      log("--install-kernel takes --user or --prefix DIR, not '%s'", a)
      return 2
    end
    i = i + 1
  end
  dest = (dest or (prefix .. "/share/jupyter/kernels")) .. "/" .. M.KERNEL_NAME
  if os.execute("mkdir -p " .. q(dest)) ~= 0 then log("cannot make %s", dest) return 1 end
  local argv = { prefix .. "/bin/monarch-run" }
  for _, a in ipairs(before or {}) do argv[#argv + 1] = a end
  argv[#argv + 1] = "--jupyter-kernel"
  argv[#argv + 1] = "{connection_file}"
  local f, why = io.open(dest .. "/kernel.json", "w")
  if not f then log("cannot write the kernelspec: %s", why) return 1 end
  f:write(cjson.encode { argv = argv, display_name = "Monarch (Lua)", language = "lua", interrupt_mode = "message",
    metadata = { monarch_version = core.version } }, "\n")
  f:close()
  for _, size in ipairs { "32x32", "64x64" } do
    local ok, err = copy(prefix .. "/share/monarch/jupyter/logo-" .. size .. ".png", dest .. "/logo-" .. size .. ".png")
    if not ok then log("%s (the kernelspec has no logo)", err) end
  end
  print("installed the Jupyter kernel 'Monarch (Lua)' in " .. dest)
  return 0
end

return M
