-- The job's timeline (monarch.trace, docs/tracing.md): a real monarch-run
-- with MONARCH_TRACE on real procs, read back with a JSON library.
local agent = require "support.agent"
local cjson = require "cjson"
local monarch = require "monarch"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"

local B = os.getenv("MONARCH_BUILD") or "build"
local RUN = B .. "/bin/monarch-run"
local SKEW_US = 1e9 -- each rank's trace clock runs rank x 1000 s ahead (MONARCH_TRACE_SKEW_NS)

local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1; echo \"::rc=$?\"")
  local out = f:read("*a")
  f:close()
  return out:gsub("::rc=%d+%s*$", ""), tonumber(out:match("::rc=(%d+)%s*$"))
end

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local function read_json(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("*a")
  f:close()
  return cjson.decode(s)
end

local COUNTER = [[
local Counter = {}
Counter.__index = Counter
function Counter.new(args, ctx) return setmetatable({ n = 0, proc = ctx.proc }, Counter) end
function Counter:add(k) self.n = self.n + k return self.n end
function Counter:total(t) return self.proc.call("sum", t) end
return Counter
]]

-- Kernels, a collective inside a kernel and one called from here, actor
-- endpoints (one running a kernel), a task; then rank 1 killed and
-- restarted, and the script fails: the trace of a failed run is written too.
local JOB = [[
local monarch = require "monarch"
local dir = arg[1]
local procs = monarch.hosts():spawn_procs{ procs = 3 }:options{ restart = true }
procs:load "basic"
procs:load "kcoll"
local t = procs:tensor("f32", { 256 })
procs:call("fill", t, 1):get()
procs:call("sum", t):get()
procs:call("rank"):get()
procs:call("kc_all_reduce", procs:group(), t, "sum"):get()
procs:all_reduce(t):get()
local c = procs:spawn("ctr", dir .. "/counter.lua", {})
c:call("add", 2):get()
c:call("total", t):get()
monarch.spawn(function() return procs:call("noop"):await() end):get()
monarch.trace.flush() -- what rank 1 recorded survives its death
local failed = false
procs:on_failure(function() failed = true end)
os.execute("kill -9 " .. procs:procs()[2].pid)
while not failed do monarch.sleep(0.01) end
procs:ready(30)
procs:call("noop"):get()
error("deliberate failure after the restart")
]]

-- The events of a trace, sorted out: controller spans, each proc process's
-- spans and clock, instants, names of processes and threads.
local function index(doc)
  local ix = { ctl = {}, procs = {}, instants = {}, pnames = {}, threads = {} }
  for _, e in ipairs(doc.traceEvents) do
    if e.ph == "M" and e.name == "process_name" then
      ix.pnames[e.pid] = e.args.name
      ix.pargs = ix.pargs or {}
      ix.pargs[e.pid] = e.args
    elseif e.ph == "M" and e.name == "thread_name" and e.pid > 0 then
      ix.procs[e.args.proc_pid] = { rank = e.tid, pid = e.pid, clock = e.args, spans = {} }
    elseif e.ph == "M" and e.name == "thread_name" then
      ix.threads[e.tid] = e.args.name
    elseif e.ph == "i" then
      ix.instants[#ix.instants + 1] = e
    end
  end
  for _, e in ipairs(doc.traceEvents) do
    if e.ph == "X" and e.pid == 0 then ix.ctl[#ix.ctl + 1] = e
    elseif e.ph == "X" then table.insert(ix.procs[e.args.proc_pid].spans, e) end
  end
  return ix
end

describe("monarch.trace", function()
  local dir

  setup(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    write(dir .. "/counter.lua", COUNTER)
    write(dir .. "/job.lua", JOB)
  end)

  teardown(function() os.execute("rm -rf " .. dir) end)

  describe("MONARCH_TRACE=path monarch-run script", function()
    local doc, ix, out, rc

    setup(function()
      out, rc = sh(string.format("MONARCH_TRACE=%s/out.json MONARCH_TRACE_SKEW_NS=%d %s %s/job.lua %s", dir,
        SKEW_US * 1000, RUN, dir, dir))
      doc = read_json(dir .. "/out.json")
      ix = index(doc)
    end)

    it("writes the trace when the script fails, and says where", function()
      assert.are.equal(1, rc, out)
      assert.matches("deliberate failure after the restart", out)
      assert.matches("monarch: trace written to " .. dir:gsub("%p", "%%%0") .. "/out.json: %d+ spans from 4 procs", out)
    end)

    it("has a track for every proc, the killed one and its replacement both on rank 1", function()
      local by_rank = {}
      for _, pr in pairs(ix.procs) do
        by_rank[pr.rank] = (by_rank[pr.rank] or 0) + 1
        assert.matches("^host ", ix.pnames[pr.pid])
        assert.are.equal("proc " .. pr.rank, pr.clock.name)
        assert.is_true(#pr.spans > 0)
      end
      assert.are.same({ [0] = 1, [1] = 2, [2] = 1 }, by_rank)
    end)

    it("names each host's BLAS core type and its rate", function()
      for _, pr in pairs(ix.procs) do
        local a = ix.pargs[pr.pid]
        assert.is_string(a.blas_core)
        assert.is_string(a.blas_source)
        assert.is_number(a.blas_gflops)
      end
    end)

    it("names every kernel, endpoint and collective on every rank", function()
      local names = { [0] = {}, {}, {} }
      for _, pr in pairs(ix.procs) do
        -- Spans inside a call (no seq of their own): a kernel's collective, an actor's proc.call.
        for _, e in ipairs(pr.spans) do names[pr.rank][e.cat .. " " .. e.name .. (e.args.seq and "" or " inside")] = e end
      end
      for rank = 0, 2 do
        for _, want in ipairs { "kernel fill", "kernel sum", "kernel rank", "kernel noop", "kernel kc_all_reduce",
          "collective all_reduce inside", "collective __coll_all_reduce", "endpoint ctr.add", "endpoint ctr.total",
          "kernel sum inside",
          "builtin __load", "actor __actor_spawn" } do
          assert.is_truthy(names[rank][want], "rank " .. rank .. " lacks " .. want)
        end
        -- 256 f32 moved by each collective, and by the kernels given the tensor.
        assert.are.equal(1024, names[rank]["collective all_reduce inside"].args.tensor_bytes)
        assert.are.equal(1024, names[rank]["collective __coll_all_reduce"].args.tensor_bytes)
        assert.are.equal(1024, names[rank]["kernel fill"].args.tensor_bytes)
        assert.is_true(names[rank]["kernel fill"].args.bytes_in > 0 and names[rank]["kernel sum"].args.bytes_out > 0)
      end
    end)

    it("aligns every proc's clock with the controller's, within the uncertainty it states", function()
      for _, pr in pairs(ix.procs) do
        local c = pr.clock
        assert.is_true(c.aligned)
        assert.is_true(c.clock_uncertainty_us >= 0)
        assert.is_true(math.abs(c.clock_offset_us - pr.rank * SKEW_US) <= c.clock_uncertainty_us + 1,
          string.format("rank %d: offset %.1f us, skew %.1f us, uncertainty %.1f us", pr.rank, c.clock_offset_us,
            pr.rank * SKEW_US, c.clock_uncertainty_us))
      end
    end)

    it("puts every span inside the run, calls in order and collectives inside their kernel", function()
      local wall = doc.otherData.wall_us
      local function inside(e, slack)
        assert.is_true(e.dur >= 0, e.name)
        assert.is_true(e.ts >= -slack and e.ts + e.dur <= wall + slack,
          string.format("%s at %.1f+%.1f us is outside the run (0..%.1f us, +-%.1f)", e.name, e.ts, e.dur, wall, slack))
      end
      for _, e in ipairs(ix.ctl) do inside(e, 1) end
      for _, pr in pairs(ix.procs) do
        local slack = pr.clock.clock_uncertainty_us + 1
        local calls = {}
        for _, e in ipairs(pr.spans) do
          inside(e, slack)
          if e.args.seq then calls[#calls + 1] = e end
        end
        table.sort(calls, function(a, b) return a.args.seq < b.args.seq end)
        for i = 2, #calls do
          assert.is_true(calls[i].ts >= calls[i - 1].ts + calls[i - 1].dur - 0.01,
            string.format("rank %d: call %d (%s) starts before call %d (%s) ended", pr.rank, calls[i].args.seq,
              calls[i].name, calls[i - 1].args.seq, calls[i - 1].name))
        end
        for _, e in ipairs(pr.spans) do
          if e.cat == "collective" and not e.args.seq then
            local parent
            for _, k in ipairs(calls) do if k.name == "kc_all_reduce" then parent = k end end
            assert.is_true(e.ts >= parent.ts - 0.01 and e.ts + e.dur <= parent.ts + parent.dur + 0.01)
          end
        end
      end
    end)

    it("marks the kill and the restart on rank 1's track", function()
      local failed, restarted
      for _, e in ipairs(ix.instants) do
        if e.tid == 1 and e.name == "proc failed" then failed = e end
        if e.tid == 1 and e.name == "proc restarted" then restarted = e end
      end
      assert.is_truthy(failed, "no 'proc failed' instant on rank 1")
      assert.matches("SIGKILL", failed.args.cause)
      assert.is_true(failed.args.restarting)
      assert.is_truthy(restarted, "no 'proc restarted' instant on rank 1")
      assert.is_true(restarted.ts >= failed.ts)
      assert.are_not.equal(failed.args.pid, restarted.args.pid)
      -- The replacement's last noop ran after it came back.
      local last
      for _, e in ipairs(ix.procs[restarted.args.pid].spans) do if e.name == "noop" then last = e end end
      assert.is_truthy(last, "the restarted proc has no noop span")
      assert.is_true(last.ts + 2 * ix.procs[restarted.args.pid].clock.clock_uncertainty_us + 1 >= restarted.ts)
    end)

    it("has the controller's track: submits, waits and a task", function()
      assert.are.equal("controller", ix.pnames[0])
      assert.are.equal("script", ix.threads[0])
      local seen = {}
      for _, e in ipairs(ix.ctl) do seen[e.cat .. " " .. e.name] = e end
      assert.are.equal(3, seen["submit fill"].args.procs)
      assert.is_truthy(seen["wait call 'fill'"])
      assert.is_truthy(seen["submit noop"])
      local task -- the script's (the restart runs one too)
      for _, e in ipairs(ix.ctl) do if e.cat == "task" and e.name:match("^task %d+ %(.*job%.lua:%d+%)$") then task = e end end
      assert.is_truthy(task, "no task of job.lua")
      assert.is_true(task.args.ok)
      assert.are.equal(task.name, ix.threads[task.tid])
    end)
  end)

  describe("start and stop from a script", function()
    local procs, daemon

    setup(function()
      monarch.hosts()
      -- An agent of its own: the suite's earlier specs may have left the shared one in any state.
      daemon = agent.start{ token = runtime.token }
      procs = mesh_mod.host_mesh(mesh_mod.connect_agents{ daemon.addr }):spawn_procs{ procs = 2 }
      procs:load "basic"
    end)

    teardown(function()
      if procs then procs:stop() end
      if daemon then daemon:stop() end
    end)

    it("writes what ran between them, and nothing after", function()
      local path = dir .. "/inline.json"
      monarch.trace.start(path)
      for _ = 1, 5 do procs:call("noop"):get() end
      local s = monarch.trace.stop()
      assert.are.equal(path, s.path)
      assert.is_true(s.procs >= 2) -- and those other specs left running
      local mine, n = {}, 0
      for _, p in ipairs(procs:procs()) do mine[p.pid] = true end
      for _, e in ipairs(read_json(path).traceEvents) do
        if e.ph == "X" and e.name == "noop" and e.pid > 0 and mine[e.args.proc_pid] then n = n + 1 end
      end
      assert.are.equal(10, n)
      -- Stopped on the procs too: calls now leave nothing in their rings.
      procs:call("noop"):get()
      local taken = procs:call("__trace", "take"):get():values()
      for _, v in ipairs(taken) do assert.are.equal(0, #v[2]) end
      assert.is_false(monarch.trace.on)
    end)

    it("records nothing while paused, on the procs and here, and goes on after resume", function()
      local path = dir .. "/paused.json"
      monarch.trace.start(path)
      procs:call("noop"):get()
      monarch.trace.pause()
      monarch.trace.pause() -- a second pause is the same pause
      assert.is_false(monarch.trace.on)
      for _ = 1, 3 do procs:call("rank"):get() end
      monarch.trace.resume()
      assert.is_true(monarch.trace.on)
      procs:call("noop"):get()
      monarch.trace.stop()
      local mine = {}
      for _, p in ipairs(procs:procs()) do mine[p.pid] = true end
      local noops, ranks, submits = 0, 0, {}
      for _, e in ipairs(read_json(path).traceEvents) do
        if e.ph == "X" and e.pid > 0 and mine[e.args.proc_pid] then
          if e.name == "noop" then noops = noops + 1 elseif e.name == "rank" then ranks = ranks + 1 end
        elseif e.ph == "X" and e.pid == 0 and e.cat == "submit" then
          submits[e.name] = (submits[e.name] or 0) + 1
        end
      end
      assert.are.equal(4, noops) -- 2 procs x 2 calls
      assert.are.equal(0, ranks)
      assert.are.same({ noop = 2 }, submits)
    end)

    it("drains all a ring holds at every drain, however many takes that is", function()
      -- Takes of 500 spans, 20 drains a second, a ring of 8192: one take per drain would
      -- keep 10,000 spans a second and the last 8192, fewer than 3 s of round trips here.
      local take, drain = monarch.trace.TAKE, monarch.trace.DRAIN
      monarch.trace.TAKE, monarch.trace.DRAIN = 500, 0.05
      local one = procs:slice({ procs = 0 })
      local pid = procs:procs()[1].pid
      monarch.trace.start(dir .. "/drains.json", { spans = 8192 })
      local n, t_end = 0, monarch.now() + 3
      while monarch.now() < t_end do
        one:call_one("noop"):get()
        n = n + 1
      end
      local ok, s = pcall(monarch.trace.stop)
      monarch.trace.TAKE, monarch.trace.DRAIN = take, drain
      assert(ok, s)
      local spans = 0
      for _, e in ipairs(read_json(dir .. "/drains.json").traceEvents) do
        if e.ph == "X" and e.name == "noop" and e.pid > 0 and e.args.proc_pid == pid then spans = spans + 1 end
      end
      assert.are.equal(n, spans, n .. " calls")
    end)

    it("refuses misuse with messages that say what to do", function()
      assert.has_error(function() monarch.trace.stop() end,
        "monarch.trace.stop: not tracing (monarch.trace.start(path) first)")
      assert.has_error(function() monarch.trace.pause() end,
        "monarch.trace.pause: not tracing (monarch.trace.start(path) first)")
      assert.has_error(function() monarch.trace.resume() end,
        "monarch.trace.resume: not tracing (monarch.trace.start(path) first)")
      local ok, err = pcall(monarch.trace.start, dir .. "/no/such/dir/t.json")
      assert.is_false(ok)
      assert.matches("monarch.trace.start: cannot write the trace: .*no/such/dir/t.json", err)
      ok, err = pcall(monarch.trace.start, dir .. "/t.json", { spans = 0 })
      assert.is_false(ok)
      assert.matches("spans wants an integer", err)
      monarch.trace.start(dir .. "/t.json")
      ok, err = pcall(monarch.trace.start, dir .. "/t2.json")
      monarch.trace.stop()
      assert.is_false(ok)
      assert.matches("already tracing into .*t.json", err)
    end)
  end)
end)
