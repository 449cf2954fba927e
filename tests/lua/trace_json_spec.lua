-- monarch.trace_json: a recording written as trace-event JSON and read back
-- with lua-cjson; the proc's spans are packed here as host/proc/trace.c packs them.
local cjson = require "cjson"
local ffi = require "ffi"
local trace = require "monarch.trace"
local trace_json = require "monarch.trace_json"

-- One span of MN_TRACE_REC bytes (monarch_trace_span, declared by trace_json).
local function span(t) -- t: t0, t1 (ns on the proc's clock), seq, name, kind, failed, tensor_bytes
  local r = ffi.new("monarch_trace_span")
  r.t0, r.t1, r.seq, r.kind, r.failed = t.t0, t.t1, t.seq or 0, t.kind or 0, t.failed or 0
  r.bytes_in, r.bytes_out, r.tensor_bytes = 30, 9, t.tensor_bytes or 0
  r.name_len = #t.name
  ffi.copy(r.name, t.name, #t.name)
  return ffi.string(r, ffi.sizeof(r))
end

local function written(s)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  local summary = trace_json.write(s, f)
  f:close()
  f = assert(io.open(path, "rb"))
  local doc = cjson.decode(f:read("*a"))
  f:close()
  os.remove(path)
  return doc, summary
end

local function recording()
  local agent = { hostname = "h1", addr = "10.0.0.1", port = 7000 }
  -- The proc's clock runs 1000 s ahead of the controller's, known to within 2 us.
  local off = 1000e9
  local bin = span { t0 = 100.25e9 + off, t1 = 100.25e9 + off + 1500, seq = 4, name = "fill", tensor_bytes = 1024 }
    .. span { t0 = 100.5e9 + off, t1 = 100.5e9 + off + 10, name = "all_reduce", kind = 2 }
    .. span { t0 = 100.75e9 + off, t1 = 100.75e9 + off + 20, seq = 5, name = "Ctr.add", kind = 1, failed = 1 }
  local s = trace.recording(100)
  s.t_stop = 101
  trace.add_event(s, "submit", 'quote " back \\ nl \n ctl \1 high \128', 100.2, 100.201, 0, 3)
  trace.add_event(s, "wait", "call 'fill'", 100.3, 100.4, 0)
  s.tasks[1] = { name = "task 1 (job.lua:3)", t0 = 100.1 } -- still running at stop
  s.instants[1] = { name = "proc failed", ts = 100.9, rank = 2, agent = agent, args = { cause = "killed by SIGKILL" } }
  s.tracks[1] = { rank = 2, pid = 4242, agent = agent, bins = { trace.keep(bin) }, offset_ns = off, rtt = 4e-6,
    dropped = 7 }
  return s
end

describe("monarch.trace_json.write", function()
  it("writes JSON a strict parser reads, names escaped whatever bytes they hold", function()
    local doc = written(recording())
    local submit
    for _, e in ipairs(doc.traceEvents) do if e.cat == "submit" then submit = e end end
    assert.are.equal('quote " back \\ nl \n ctl \1 high \194\128', submit.name) -- byte 0x80 became U+0080
    assert.are.equal(3, submit.args.procs)
    assert.are.equal(1000, doc.otherData.wall_us / 1000)
  end)

  it("moves proc spans onto the controller's clock and keeps their details", function()
    local doc, summary = written(recording())
    local by = {}
    for _, e in ipairs(doc.traceEvents) do if e.ph == "X" and e.pid == 1 then by[e.name] = e end end
    assert.are.equal(3, summary.spans)
    assert.are.equal(7, summary.dropped)
    assert.near(250000, by.fill.ts, 0.01) -- 100.25 s on the controller, 0.25 s after the start
    assert.near(1.5, by.fill.dur, 1e-9)
    assert.are.same({ "kernel", 2, 4, 1024, 30, 9, 4242 }, { by.fill.cat, by.fill.tid, by.fill.args.seq,
      by.fill.args.tensor_bytes, by.fill.args.bytes_in, by.fill.args.bytes_out, by.fill.args.proc_pid })
    assert.are.equal("collective", by.all_reduce.cat)
    assert.is_nil(by.all_reduce.args.seq) -- inside a call: no seq of its own
    assert.are.equal("endpoint", by["Ctr.add"].cat)
    assert.is_true(by["Ctr.add"].args.failed)
  end)

  it("names the tracks, states each clock and ends running tasks at stop", function()
    local doc = written(recording())
    local names, instant, task = {}, nil, nil
    for _, e in ipairs(doc.traceEvents) do
      if e.ph == "M" and (e.name == "process_name" or e.name == "thread_name") then
        names[e.pid .. "/" .. tostring(e.tid)] = e.args
      end
      if e.ph == "i" then instant = e end
      if e.cat == "task" then task = e end
    end
    assert.are.equal("controller", names["0/nil"].name)
    assert.are.equal("script", names["0/0"].name)
    assert.are.equal("task 1 (job.lua:3)", names["0/1"].name)
    assert.are.equal("host h1 (agent 10.0.0.1:7000)", names["1/nil"].name)
    local proc = names["1/2"]
    assert.are.same({ "proc 2", 4242, true, 7 }, { proc.name, proc.proc_pid, proc.aligned, proc.spans_dropped })
    assert.near(1e9, proc.clock_offset_us, 1e-3)
    assert.near(2, proc.clock_uncertainty_us, 1e-6)
    assert.are.same({ "proc failed", 1, 2, "killed by SIGKILL" }, { instant.name, instant.pid, instant.tid, instant.args.cause })
    assert.near(900000, instant.ts, 0.01)
    assert.is_true(task.args.unfinished)
    assert.near(900000, task.dur, 0.01) -- 100.1 s to the stop at 101 s
  end)
end)
