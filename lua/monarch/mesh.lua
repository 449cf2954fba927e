--- Meshes: HostMesh (host agents) and ProcMesh (procs spawned on them).
-- A ProcMesh is a shape over a list of procs; slicing makes a new ProcMesh
-- over a subset of the same procs. Every verb sends through the runtime.
local core = require "monarch.core"
local errors = require "monarch.errors"
local runtime = require "monarch.runtime"
local shape_mod = require "monarch.shape"
local value_mesh = require "monarch.value_mesh"
local tensor = require "monarch.tensor"

local M = {}
local unpack = unpack or table.unpack

local MSG = { SPAWN = 10, SPAWNED = 11, SPAWN_FAILED = 12, PROC_EXIT = 13, KILL = 14, ERROR = 4, PONG = 6 }
local CONNECT_TIMEOUT = 10   -- seconds to reach and authenticate a host agent
local SPAWN_TIMEOUT = 30     -- seconds for procs to start and accept our connection
local DEATH_GRACE = 1.0      -- seconds to wait for an agent's exit report after a proc's socket closes

local function wait_until(pred, timeout, what)
  local deadline = runtime.now() + timeout
  while not pred() do
    if runtime.now() > deadline then error(errors.new { kind = "timeout", message = what .. " did not finish within " .. timeout .. "s" }, 0) end
    runtime.pump(0.05)
  end
end

-- ---- procs and their failures ----------------------------------------------------

local dying = {} -- procs whose socket closed, waiting for the agent's exit report

local function describe_exit(p)
  if p.exit then
    if p.exit.signal and p.exit.signal ~= "" then return "killed by SIG" .. p.exit.signal end
    return "exited with code " .. tostring(p.exit.status)
  end
  return p.close_reason or "connection lost"
end

local function finalize_death(p)
  if p.state == "dead" or p.state == "stopped" then return end
  dying[p] = nil
  p.state = p.stopping and "stopped" or "dead"
  p.cause = p.stopping and "stopped by the script" or describe_exit(p)
  local pending = core.take_pending(p.conn)
  core.disconnect(p.conn, "proc died")
  local first_kernel
  for i = 1, #pending, 2 do
    local id, slot = pending[i], pending[i + 1]
    local rec = runtime.call_record(id)
    local kernel = rec and rec.kernel
    first_kernel = first_kernel or kernel
    local msg = i == 1 and string.format("proc %s while running '%s'", p.cause, tostring(kernel))
      or string.format("proc %s before running this call (queued behind '%s')", p.cause, tostring(first_kernel))
    runtime.fail_slot(id, slot, errors.new {
      kind = "proc_failed", message = msg, kernel = kernel, rank = p.rank, host = p.host, pid = p.pid, cause = p.cause,
    })
  end
  local ev = errors.new {
    kind = "proc_failed", rank = p.rank, host = p.host, pid = p.pid, cause = p.cause, kernel = first_kernel,
    message = "proc " .. p.cause .. (first_kernel and (" while running '" .. first_kernel .. "'") or ""),
  }
  if p.stopping then return end
  local handled = false
  for _, fn in ipairs(p.listeners or {}) do
    handled = true
    local ok, err = pcall(fn, ev)
    if not ok then runtime.unhandled(errors.new { kind = "script", message = "on_failure handler failed: " .. tostring(err) }) end
  end
  if not handled and #pending == 0 and not M.shutting_down then
    io.stderr:write(tostring(ev), "\n")
  end
end

runtime.tick(function(now)
  for p in pairs(dying) do
    if p.exit or now - p.closed_at > DEATH_GRACE then finalize_death(p) end
  end
end)

local function proc_handler(p)
  return {
    on_connected = function(info)
      p.state = "ready"
    end,
    on_message = function(m)
      if m[1] == MSG.PONG and p.pings and p.pings[m[2]] then
        local cb = p.pings[m[2]]
        p.pings[m[2]] = nil
        cb()
      elseif m[1] == MSG.ERROR then
        p.refused = "proc refused the connection: " .. tostring(m[3])
      end
    end,
    on_closed = function(reason)
      if p.state == "connecting" then
        p.state = "dead"
        p.cause = "could not connect: " .. tostring(reason)
      elseif p.state == "ready" then
        p.state = "dying"
        p.closed_at = runtime.now()
        p.close_reason = p.refused or ("connection lost: " .. tostring(reason))
        dying[p] = true
      end
    end,
  }
end

-- ---- host agents -----------------------------------------------------------------

local Agent = {}
Agent.__index = Agent
local next_req = 0

local function agent_handler(a)
  return {
    on_connected = function(info)
      a.state = "ready"
      a.hostname = info.host ~= "" and info.host or a.addr
      a.pid = info.pid
    end,
    on_closed = function(reason)
      a.state = "dead"
      a.reason = reason
    end,
    on_message = function(m)
      local t = m[1]
      if t == MSG.SPAWNED or t == MSG.SPAWN_FAILED then
        local req = a.requests[m[2]]
        if req then
          req.results[m[3] + 1] = t == MSG.SPAWNED and { pid = m[4], port = m[5] } or { error = m[4] }
          req.count = req.count + 1
        end
      elseif t == MSG.PROC_EXIT then
        local p = a.procs[m[2]]
        if p then
          p.exit = { status = m[3], signal = m[4] }
          if p.state == "ready" then
            p.state = "dying"
            p.closed_at = runtime.now()
            dying[p] = true
          elseif p.state == "dying" then
            finalize_death(p)
          end
        end
      elseif t == MSG.ERROR then
        a.reason = tostring(m[3])
      end
    end,
  }
end

--- Connects to host agents at addrs ({"host:port", ...}); returns the agent objects.
function M.connect_agents(addrs)
  local agents = {}
  for i, addr in ipairs(addrs) do
    local host, port = addr:match("^%[?([^%]]+)%]?:(%d+)$")
    if not host then error("host address '" .. addr .. "' is not HOST:PORT", 3) end
    local a = setmetatable({ addr = host, port = tonumber(port), index = i - 1, state = "connecting",
      requests = {}, procs = {} }, Agent)
    a.conn = core.connect(host, tonumber(port), "agent")
    runtime.handle(a.conn, agent_handler(a))
    agents[i] = a
  end
  local ok, err = pcall(wait_until, function()
    for _, a in ipairs(agents) do if a.state == "connecting" then return false end end
    return true
  end, CONNECT_TIMEOUT, "connecting to host agents")
  for _, a in ipairs(agents) do
    if a.state ~= "ready" then
      error(errors.new { kind = "connect", host = a.addr .. ":" .. a.port,
        message = "cannot reach host agent: " .. tostring(a.reason or (not ok and tostring(err)) or "no answer") }, 3)
    end
  end
  return agents
end

-- ---- HostMesh --------------------------------------------------------------------

local HostMesh = {}
HostMesh.__index = HostMesh

function M.host_mesh(agents)
  return setmetatable({ agents = agents, shape = shape_mod.new({ "hosts" }, { #agents }) }, HostMesh)
end

function HostMesh:size() return #self.agents end
HostMesh.__tostring = function(h)
  local names = {}
  for i, a in ipairs(h.agents) do names[i] = (a.hostname or a.addr) .. ":" .. a.port end
  return "HostMesh" .. tostring(h.shape) .. " [" .. table.concat(names, ", ") .. "]"
end

local function parse_dims(spec)
  local names, sizes = {}, {}
  if spec[1] ~= nil then
    for i, d in ipairs(spec) do
      if type(d) ~= "table" or type(d[1]) ~= "string" then
        error("spawn_procs: entry " .. i .. " must be {name, size}", 4)
      end
      names[#names + 1], sizes[#sizes + 1] = d[1], d[2]
    end
  else
    for k, v in pairs(spec) do
      if type(k) == "string" and k ~= "name" then names[#names + 1], sizes[#sizes + 1] = k, v end
    end
    if #names > 1 then
      error("spawn_procs: several named dimensions need an order; write {{'" .. names[1] .. "', " ..
        tostring(sizes[1]) .. "}, {'" .. names[2] .. "', " .. tostring(sizes[2]) .. "}}", 4)
    end
  end
  if #names == 0 then names, sizes = { "procs" }, { 1 } end
  local per_host = 1
  for i, n in ipairs(names) do
    if n == "hosts" then error("spawn_procs: 'hosts' is the host dimension; name yours differently", 4) end
    local s = sizes[i]
    if type(s) ~= "number" or s < 1 or s ~= math.floor(s) or s > 4096 then
      error("spawn_procs: dimension '" .. n .. "' wants an integer size 1..4096, got " .. tostring(s), 4)
    end
    per_host = per_host * s
  end
  if per_host > 4096 then error("spawn_procs: " .. per_host .. " procs per host exceeds the agent's limit of 4096", 4) end
  return names, sizes
end

--- Spawns procs on every host. spec: {procs = n} (or any one name), or an
-- ordered list {{"dp", 2}, {"tp", 2}}. Returns a ProcMesh of shape {hosts = H, ...}.
function HostMesh:spawn_procs(spec)
  spec = spec or { procs = 1 }
  if type(spec) ~= "table" then error("spawn_procs wants a table like {procs = 4}", 2) end
  local names, sizes = parse_dims(spec)
  local per_host = 1
  for _, s in ipairs(sizes) do per_host = per_host * s end
  local world = per_host * #self.agents
  local reqs = {}
  for h, a in ipairs(self.agents) do
    if a.state ~= "ready" then error(errors.new { kind = "connect", host = a.addr, message = "host agent is not connected" }, 2) end
    next_req = next_req + 1
    local req = { id = next_req, results = {}, count = 0, n = per_host }
    a.requests[req.id] = req
    reqs[h] = req
    core.send(a.conn, { MSG.SPAWN, req.id, { count = per_host, rank_base = (h - 1) * per_host, world = world } })
  end
  local procs = {}
  local ok, err = pcall(wait_until, function()
    for h, req in ipairs(reqs) do
      if req.count < req.n and self.agents[h].state == "ready" then return false end
    end
    return true
  end, SPAWN_TIMEOUT, "spawning procs")
  local failures = {}
  for h, a in ipairs(self.agents) do
    local req = reqs[h]
    a.requests[req.id] = nil
    for i = 1, per_host do
      local r = req.results[i]
      local rank = (h - 1) * per_host + i - 1
      if r and r.port then
        local p = { rank = rank, host = a.hostname, addr = a.addr, pid = r.pid, port = r.port,
          agent = a, state = "connecting" }
        a.procs[r.pid] = p
        p.conn = core.connect(a.addr, r.port, "proc")
        runtime.handle(p.conn, proc_handler(p))
        procs[rank + 1] = p
      else
        failures[#failures + 1] = string.format("rank %d on %s: %s", rank, a.hostname or a.addr,
          r and r.error or (a.state ~= "ready" and ("host agent lost: " .. tostring(a.reason)) or tostring(err)))
      end
    end
  end
  if #failures == 0 then
    local ok2, err2 = pcall(wait_until, function()
      for _, p in pairs(procs) do if p.state == "connecting" then return false end end
      return true
    end, SPAWN_TIMEOUT, "connecting to procs")
    for _, p in pairs(procs) do
      if p.state ~= "ready" then
        failures[#failures + 1] = string.format("rank %d on %s: %s", p.rank, p.host, p.cause or tostring(err2))
      end
    end
  end
  if #failures > 0 then
    for _, p in pairs(procs) do
      if p.agent.state == "ready" then core.send(p.agent.conn, { MSG.KILL, p.pid, 9 }) end
    end
    error(errors.new { kind = "spawn", message = "could not start " .. #failures .. " of " .. world ..
      " procs:\n  " .. table.concat(failures, "\n  ") }, 2)
  end
  local dims_n, dims_s = { "hosts" }, { #self.agents }
  for i = 1, #names do dims_n[i + 1], dims_s[i + 1] = names[i], sizes[i] end
  return M.proc_mesh(procs, shape_mod.new(dims_n, dims_s), {})
end

-- ---- ProcMesh --------------------------------------------------------------------

local ProcMesh = {}
ProcMesh.__index = ProcMesh

function M.proc_mesh(procs, shape, opts, libs)
  return setmetatable({ _procs = procs, shape = shape, _opts = opts or {}, _libs = libs or {}, _rr = 0 }, ProcMesh)
end

--- Number of procs.
function ProcMesh:size(dim)
  if dim then return self.shape:dim(dim) or error("no dimension named '" .. tostring(dim) .. "'", 2) end
  return #self._procs
end

--- Sizes by dimension name: {hosts = 1, procs = 4}.
function ProcMesh:sizes()
  local t = {}
  for i, n in ipairs(self.shape.names) do t[n] = self.shape.sizes[i] end
  return t
end

--- Global rank of the proc at coordinates (table or positional), or the list of ranks.
function ProcMesh:rank(...)
  if select("#", ...) == 0 then
    local r = {}
    for i, p in ipairs(self._procs) do r[i] = p.rank end
    return r
  end
  local c = ...
  if type(c) ~= "table" then c = { ... } end
  return self._procs[self.shape:index(c)].rank
end

--- Proc records (rank, host, pid, state) for inspection.
function ProcMesh:procs()
  local out = {}
  for i, p in ipairs(self._procs) do
    out[i] = { rank = p.rank, host = p.host, pid = p.pid, state = p.state, cause = p.cause }
  end
  return out
end

--- A view of the same procs along fewer positions: {dim = i} drops dim,
-- {dim = {from, to}} keeps positions from..to-1.
function ProcMesh:slice(spec)
  if type(spec) ~= "table" then error("slice wants a table like {procs = 0} or {procs = {0, 2}}", 2) end
  local s, keep = self.shape:slice(spec)
  local procs = {}
  for i, k in ipairs(keep) do procs[i] = self._procs[k] end
  return M.proc_mesh(procs, s, self._opts, self._libs)
end

local OPTIONS = { timeout = "number" }

--- A view of this mesh whose calls use these options: {timeout = seconds}.
function ProcMesh:options(o)
  local merged = {}
  for k, v in pairs(self._opts) do merged[k] = v end
  for k, v in pairs(o or {}) do
    if not OPTIONS[k] then error("unknown call option '" .. tostring(k) .. "' (known: timeout)", 2) end
    if type(v) ~= OPTIONS[k] or v <= 0 then error("option " .. k .. " wants a positive " .. OPTIONS[k], 2) end
    merged[k] = v
  end
  return M.proc_mesh(self._procs, self.shape, merged, self._libs)
end

local function check_kernel(kernel, level)
  if type(kernel) ~= "string" or kernel == "" then
    error("kernel name must be a non-empty string, got " .. type(kernel), level + 1)
  end
end

function ProcMesh:_submit(kernel, args, nargs, o)
  tensor.flush_frees()
  local shape = self.shape
  local convert = o.convert
  return runtime.submit(self._procs, kernel, args, nargs, {
    mode = o.mode, timeout = o.timeout or self._opts.timeout, what = o.what, on_slot = o.on_slot,
    make_result = function(values, n)
      if convert then
        for i = 1, n do values[i] = convert(values[i]) end
      end
      return value_mesh.new(shape, values, n)
    end,
  }).future
end

--- Loads a kernel library on every proc (blocking); raises a clear error if any proc cannot.
function ProcMesh:load(lib)
  check_kernel(lib, 2)
  local fut = self:_submit("__load", { lib }, 1, { what = "load of '" .. lib .. "'" })
  local ok, err = pcall(fut.get, fut)
  if not ok then
    if errors.is(err) then
      err.kernel = nil
      err.kind = "load"
    end
    error(err, 2)
  end
  self._libs[#self._libs + 1] = lib
  return self
end

--- Calls kernel(...) on every proc; returns a Future of a ValueMesh.
function ProcMesh:call(kernel, ...)
  check_kernel(kernel, 2)
  return self:_submit(kernel, { ... }, select("#", ...), {})
end

--- Calls kernel(...) on the one proc of this mesh; returns a Future of its value.
function ProcMesh:call_one(kernel, ...)
  check_kernel(kernel, 2)
  if #self._procs ~= 1 then
    error("call_one needs a mesh of exactly one proc; this one has " .. #self._procs .. " (slice it first)", 2)
  end
  tensor.flush_frees()
  return runtime.submit(self._procs, kernel, { ... }, select("#", ...), { mode = "one", timeout = self._opts.timeout }).future
end

--- Calls kernel(...) on every proc without waiting for results. A failure
-- stops the script at its next wait (use call() to handle errors yourself).
function ProcMesh:broadcast(kernel, ...)
  check_kernel(kernel, 2)
  tensor.flush_frees()
  runtime.submit(self._procs, kernel, { ... }, select("#", ...), { mode = "broadcast", timeout = self._opts.timeout })
end

--- Calls kernel(...) on one live proc, the least busy; returns a Future of its value.
function ProcMesh:choose(kernel, ...)
  check_kernel(kernel, 2)
  local best, best_load
  local n = #self._procs
  for k = 1, n do
    local i = (self._rr + k - 1) % n + 1
    local p = self._procs[i]
    if p.state == "ready" then
      local _, _, _, _, inflight = core.info(p.conn)
      if not best or inflight < best_load then best, best_load = p, inflight end
    end
  end
  self._rr = self._rr + 1
  if not best then error(errors.new { kind = "proc_failed", kernel = kernel, message = "no live proc in this mesh to choose" }, 2) end
  tensor.flush_frees()
  return runtime.submit({ best }, kernel, { ... }, select("#", ...), { mode = "one", timeout = self._opts.timeout }).future
end

--- Calls kernel(...) on every proc and iterates (coords, value) as results arrive.
-- A failed proc raises its error from the loop.
function ProcMesh:stream(kernel, ...)
  check_kernel(kernel, 2)
  local queue, head, tail, total, seen = {}, 1, 0, #self._procs, 0
  local fut = self:_submit(kernel, { ... }, select("#", ...), {
    on_slot = function(slot, ok, v)
      tail = tail + 1
      queue[tail] = { slot, ok, v }
    end,
  })
  local shape = self.shape
  return function()
    if seen == total then return nil end
    while head > tail do
      -- A call timeout fails the future without delivering the missing slots.
      if fut.state == "error" and fut.err.kind == "timeout" then
        seen = total
        error(fut.err, 2)
      end
      runtime.pump(nil)
    end
    local e = queue[head]
    queue[head] = nil
    head = head + 1
    seen = seen + 1
    if seen == total then fut.observed = true end
    if not e[2] then error(e[3], 2) end
    return shape:coords(e[1]), e[3]
  end
end

--- A tensor of dtype and shape on every proc of this mesh (zeroed).
function ProcMesh:tensor(dtype, shape)
  return tensor.new(self, dtype, shape)
end

--- Calls fn(err) whenever a proc of this mesh fails.
function ProcMesh:on_failure(fn)
  if type(fn) ~= "function" then error("on_failure wants a function", 2) end
  for _, p in ipairs(self._procs) do
    p.listeners = p.listeners or {}
    p.listeners[#p.listeners + 1] = fn
  end
  return self
end

local next_ping = 0

--- Pings every proc's I/O thread (answered even while a kernel runs).
-- Returns a Future of a ValueMesh of round-trip seconds.
function ProcMesh:ping()
  local fut = require("monarch.future").new("ping")
  local n, left, values = #self._procs, #self._procs, {}
  local shape = self.shape
  for i, p in ipairs(self._procs) do
    if p.state ~= "ready" then
      fut:fail(errors.new { kind = "proc_failed", rank = p.rank, host = p.host, pid = p.pid, message = "proc is " .. p.state })
      return fut
    end
    next_ping = next_ping + 1
    local t0 = runtime.now()
    p.pings = p.pings or {}
    p.pings[next_ping] = function()
      values[i] = runtime.now() - t0
      left = left - 1
      if left == 0 then fut:resolve(value_mesh.new(shape, values, n)) end
    end
    core.send(p.conn, { 5, next_ping })
  end
  return fut
end

--- Stops the procs of this mesh.
function ProcMesh:stop()
  for _, p in ipairs(self._procs) do
    if p.state == "ready" and p.agent.state == "ready" then
      p.stopping = true
      core.send(p.agent.conn, { MSG.KILL, p.pid, 15 })
    end
  end
end

ProcMesh.__tostring = function(m)
  local alive = 0
  for _, p in ipairs(m._procs) do if p.state == "ready" then alive = alive + 1 end end
  return string.format("ProcMesh%s (%d procs, %d alive)", tostring(m.shape), #m._procs, alive)
end

M.HostMesh, M.ProcMesh = HostMesh, ProcMesh
return M
