--- monarch.trace_json: a recording of monarch.trace written as trace-event
-- JSON (the Trace Event Format's object form, which Perfetto and
-- chrome://tracing open). Output formatting only: every value written is a
-- number, a boolean or a string escaped here.
--   pid 0 is the controller: tid 0 the script, tid N task N.
--   pid H (1, 2, ...) is a host agent: tid R the proc of rank R.
local ffi = require "ffi"

local M = {}

-- One span as host/proc/trace.c packs it: MN_TRACE_REC little-endian bytes.
pcall(ffi.cdef, [[
typedef struct {
  int64_t t0, t1;
  uint64_t seq, tensor_bytes;
  uint32_t bytes_in, bytes_out;
  uint8_t kind, failed, name_len, pad;
  char name[52];
} monarch_trace_span;
]])
local REC = 96
assert(ffi.sizeof("monarch_trace_span") == REC, "monarch_trace_span must match MN_TRACE_REC")
local span_ptr = ffi.typeof("const monarch_trace_span *")

-- ---- values ------------------------------------------------------------------------

local ESC = { ['"'] = '\\"', ["\\"] = "\\\\", ["\n"] = "\\n", ["\t"] = "\\t", ["\r"] = "\\r" }
for b = 0, 255 do
  local c = string.char(b)
  -- Bytes past ASCII are written as code points 128-255: always valid JSON, whatever the name held.
  if not ESC[c] and (b < 32 or b >= 127) then ESC[c] = string.format("\\u%04x", b) end
end

local function str(s)
  return '"' .. tostring(s):gsub('[%z\1-\31"\\\127-\255]', ESC) .. '"'
end

local function num(x)
  if x ~= x or x == math.huge or x == -math.huge then return "null" end
  if x == math.floor(x) and math.abs(x) < 2 ^ 53 then return string.format("%d", x) end
  return string.format("%.3f", x)
end

-- {k = v} with string keys (sorted) and number, boolean or string values.
local function obj(t)
  local keys, out = {}, {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  for i, k in ipairs(keys) do
    local v = t[k]
    local tv = type(v)
    out[i] = str(k) .. ":" .. (tv == "number" and num(v) or tv == "boolean" and tostring(v) or str(v))
  end
  return "{" .. table.concat(out, ",") .. "}"
end

-- ---- events ------------------------------------------------------------------------

local function writer(f)
  local w = { n = 0 }
  function w.event(e)
    f:write(w.n == 0 and "\n" or ",\n", obj(e))
    w.n = w.n + 1
  end
  -- An event whose args is itself a table: written by hand, args last.
  function w.with_args(e, args)
    local head = obj(e)
    f:write(w.n == 0 and "\n" or ",\n", head:sub(1, -2), ',"args":', obj(args), "}")
    w.n = w.n + 1
  end
  return w
end

local function category(kind, name)
  if kind == 1 then return "endpoint" end
  if kind == 2 then return "collective" end
  if kind == 3 then return "kernel" end -- run by an actor (proc.call)
  if name:sub(1, 2) ~= "__" then return "kernel" end
  if name:sub(1, 7) == "__coll_" then return "collective" end
  if name:sub(1, 8) == "__actor_" then return "actor" end
  return "builtin"
end

-- The controller's spans: submits, waits and tasks (those still running end at stop).
local function controller_events(w, s)
  local base = s.t_start
  local event = s.event -- monarch.trace's reader of its events
  for i = 1, s.n do
    local cat, name, t0, t1, tid, arg = event(s, i)
    local args = cat == "submit" and { procs = arg } or cat == "task" and { ok = arg } or {}
    w.with_args({ ph = "X", cat = cat, name = name, pid = 0, tid = tid, ts = (t0 - base) * 1e6, dur = (t1 - t0) * 1e6 },
      args)
  end
  for tid, t in pairs(s.tasks) do
    if not t.done then
      w.with_args({ ph = "X", cat = "task", name = t.name, pid = 0, tid = tid, ts = (t.t0 - base) * 1e6,
        dur = (s.t_stop - t.t0) * 1e6 }, { unfinished = true })
    end
  end
end

-- One proc process's spans, on its host's pid and its rank's tid, moved onto the controller's clock.
local function proc_events(w, s, tr, pid)
  local off, base, count = tr.offset_ns or 0, s.t_start * 1e6, 0
  for _, bin in ipairs(tr.bins) do
    local p = ffi.cast(span_ptr, bin.ptr)
    for i = 0, bin.n / REC - 1 do
      local r = p[i]
      local name = ffi.string(r.name, r.name_len)
      local args = { bytes_in = r.bytes_in, bytes_out = r.bytes_out, proc_pid = tr.pid }
      if r.kind < 2 then args.seq = tonumber(r.seq) end
      if r.tensor_bytes > 0 then args.tensor_bytes = tonumber(r.tensor_bytes) end
      if r.failed ~= 0 then args.failed = true end
      w.with_args({ ph = "X", cat = category(r.kind, name), name = name, pid = pid, tid = tr.rank,
        ts = (tonumber(r.t0) - off) / 1e3 - base, dur = tonumber(r.t1 - r.t0) / 1e3 }, args)
      count = count + 1
    end
  end
  return count
end

local function metadata(w, what, pid, tid, args)
  w.with_args({ ph = "M", name = what, pid = pid, tid = tid }, args)
end

--- Writes recording s (monarch.trace's) to the open file f; returns
-- {events, spans, procs, dropped}.
function M.write(s, f)
  if not ffi.abi("le") then error("monarch.trace: reading the procs' spans needs a little-endian controller", 0) end
  local w = writer(f)
  f:write('{"displayTimeUnit":"ns","otherData":', obj {
    monarch_trace = "monarch.trace", wall_us = (s.t_stop - s.t_start) * 1e6,
    controller_events_dropped = s.dropped, collect_error = s.collect_error,
  }, ',"traceEvents":[')
  metadata(w, "process_name", 0, nil, { name = "controller" })
  metadata(w, "process_sort_index", 0, nil, { sort_index = 0 })
  metadata(w, "thread_name", 0, 0, { name = "script" })
  for tid, t in pairs(s.tasks) do metadata(w, "thread_name", 0, tid, { name = t.name }) end
  controller_events(w, s)
  local hosts, nhosts = {}, 0
  local function host_pid(a)
    if not hosts[a] then
      nhosts = nhosts + 1
      hosts[a] = nhosts
      local b = (s.host_blas or {})[a] or {}
      metadata(w, "process_name", nhosts, nil, { name = "host " .. tostring(a.hostname or a.addr) .. " (agent " ..
        tostring(a.addr) .. ":" .. tostring(a.port) .. ")", blas_core = b.core, blas_gflops = b.gflops,
        blas_source = b.source, blas_openblas = b.openblas, blas_openblas_gflops = b.openblas_gflops })
      metadata(w, "process_sort_index", nhosts, nil, { sort_index = nhosts })
    end
    return hosts[a]
  end
  local spans, dropped = 0, s.dropped
  for _, tr in ipairs(s.tracks) do
    local pid = host_pid(tr.agent)
    -- Its clock: unaligned (no sample came back) shows offset 0 and uncertainty -1.
    metadata(w, "thread_name", pid, tr.rank, { name = "proc " .. tr.rank, proc_pid = tr.pid,
      aligned = tr.offset_ns ~= nil, clock_offset_us = tr.offset_ns and tr.offset_ns / 1e3 or 0,
      clock_uncertainty_us = tr.rtt and tr.rtt / 2 * 1e6 or -1, spans_dropped = tr.dropped, error = tr.error })
    metadata(w, "thread_sort_index", pid, tr.rank, { sort_index = tr.rank })
    spans = spans + proc_events(w, s, tr, pid)
    dropped = dropped + tr.dropped
  end
  for _, e in ipairs(s.instants) do
    w.with_args({ ph = "i", s = "t", name = e.name, pid = host_pid(e.agent), tid = e.rank,
      ts = (e.ts - s.t_start) * 1e6 }, e.args)
  end
  f:write("\n]}\n")
  return { events = w.n, spans = spans, procs = #s.tracks, dropped = dropped }
end

return M
