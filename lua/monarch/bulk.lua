--- Same-host bulk: put, scatter and fetch between the controller and a proc
-- on this host copy memory directly instead of streaming it over the proc's
-- socket. The proc does the one copy itself (process_vm_readv/writev, in the
-- built-ins __bulk_put and __bulk_fetch) when it reaches the call, so the
-- order of calls is exactly as over TCP. Each proc is asked once, when it
-- connects, whether it can reach our memory (__bulk_probe, which reads a
-- random cookie from us); where it cannot (another host, Yama's
-- ptrace_scope, another PID namespace or user) its transfers stay on TCP.
--   MONARCH_BULK_LOCAL=0   never (every transfer on TCP)
--   MONARCH_BULK_LOCAL=1   probe every proc, whatever its address
--   unset                  probe procs whose agent is at a loopback address
local core = require "monarch.core"
local runtime = require "monarch.runtime"

local M = {}

--- Chunks and bytes moved each way since the start: tests and benchmarks
-- read it to see which path a transfer took.
M.stats = { local_puts = 0, local_fetches = 0, tcp_puts = 0, tcp_fetches = 0, local_bytes = 0, tcp_bytes = 0 }

--- Bytes per __bulk_ call. A call is the unit of ordering, progress and
-- cancellation, as M.CHUNK is over TCP; the proc copies it in 4 MiB pieces
-- (MN_BULK_PIECE) and sees a cancel between them.
M.CHUNK = 32 * 1024 * 1024

--- Seconds a transfer waits for a proc's probe still in flight before it
-- takes TCP this once. The probe is the proc's first call, so it is only
-- ever behind the connection itself.
M.PROBE_WAIT = 2

local function on_this_host(addr)
  return addr == "localhost" or addr == "::1" or (type(addr) == "string" and addr:match("^127%.") ~= nil)
end

--- Asks proc p (just connected) whether it can copy our memory; sets
-- p.bulk to true, false, or "probing" until the answer comes, and
-- p.bulk_why to the reason for false.
function M.probe(p)
  -- No link of its own (port 0: reached through its host agent only, a simulated proc): nothing to
  -- ask, and no field to spend on a proc of which a mesh holds thousands.
  if p.port == 0 then return end
  local mode = os.getenv("MONARCH_BULK_LOCAL")
  p.bulk, p.bulk_why = false, nil
  if mode == "0" then
    p.bulk_why = "MONARCH_BULK_LOCAL=0"
    return
  end
  if mode ~= "1" and not on_this_host(p.addr) then
    p.bulk_why = "its agent is not at a loopback address (MONARCH_BULK_LOCAL=1 probes it anyway)"
    return
  end
  local pid, addr, cookie = core.bulk_self()
  p.bulk = "probing"
  local conn = p.conn
  local rec = runtime.submit({ p }, "__bulk_probe", { pid, addr, cookie }, 3,
    { mode = "one", bypass = true, what = "same-host bulk probe" })
  rec.internal = true -- the runtime's own: its failure is no sign that the script heard of a death
  rec.future:on_done(function(f)
    if p.conn ~= conn then return end -- answered for a connection the proc has since replaced
    local ok, v = f:result()
    p.bulk = ok and v == true
    if not p.bulk then p.bulk_why = ok and type(v) == "table" and tostring(v[2]) or tostring(v) end
  end)
end

--- The procs of `procs` whose transfers go local now, as a set; waits
-- (pumping) for probes still in flight, up to M.PROBE_WAIT.
function M.local_set(procs)
  local set, deadline = {}, nil
  for _, p in ipairs(procs) do
    while p.bulk == "probing" do
      deadline = deadline or runtime.now() + M.PROBE_WAIT
      if runtime.now() > deadline then break end
      runtime.pump(0.001)
    end
    if p.bulk == true and p.state == "ready" then set[p] = true end
  end
  return set
end

-- A proc whose copy failed after its probe said yes: its later transfers take TCP.
local function watch(rec, procs)
  rec.future:on_done(function(f)
    local ok, err = f:result()
    if ok or type(err) ~= "table" then return end
    for _, e in ipairs(err.failures or { err }) do
      if e.kind == "bulk" then
        for _, p in ipairs(procs) do
          if p.rank == e.rank then p.bulk, p.bulk_why = false, "a copy failed: " .. tostring(e.message) end
        end
      end
    end
  end)
end

--- Queues one __bulk_put or __bulk_fetch per proc of procs (slot i =
-- procs[i]) for call `id`: len bytes at tensor offset off, from or to
-- addrs[i] here; holds[i] is kept alive until that proc answers.
-- Returns the deepest queue.
function M.queue(id, kernel, procs, tensor, off, len, addrs, holds)
  local pid, caddr, cookie = core.bulk_self()
  local deepest = 0
  for i, p in ipairs(procs) do
    local d = core.call_as(id, p.conn, i, kernel, tensor, off, len, addrs[i], pid, caddr, cookie)
    core.hold(id, i, p.conn, holds[i])
    if d > deepest then deepest = d end
  end
  return deepest
end

--- Submits kernel ("__bulk_put" or "__bulk_fetch") to procs for len bytes
-- at tensor offset off, from or to addrs[i] (holds[i] keeps it alive);
-- returns the record.
function M.submit(kernel, procs, tensor, off, len, addrs, holds, what)
  local rec = runtime.submit_custom(procs, kernel, function(id)
    return M.queue(id, kernel, procs, tensor, off, len, addrs, holds)
  end, { what = what })
  watch(rec, procs)
  return rec
end

return M
