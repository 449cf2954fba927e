--- Same-host bulk: put, scatter and fetch between the controller and a proc
-- on this host copy memory directly instead of streaming it over the proc's
-- socket. The proc does the one copy itself (in the built-ins __bulk_put
-- and __bulk_fetch) when it reaches the call, so the order of calls is
-- exactly as over TCP. A HostTensor of M.SHARED_MIN bytes or more lives in
-- a memfd (M.shared): the proc maps it once, keeps the map for later
-- transfers, and copies with plain stores at memcpy's speed. Other memory
-- (strings, small HostTensors) it copies with process_vm_readv/writev, a
-- kernel copy that runs at about half that speed. Each proc is asked once,
-- when it connects, whether it can reach our memory (__bulk_probe, which
-- reads a random cookie from us); where it cannot (another host, Yama's
-- ptrace_scope, another PID namespace or user) its transfers stay on TCP.
--   MONARCH_BULK_LOCAL=0   never (every transfer on TCP)
--   MONARCH_BULK_LOCAL=1   probe every proc, whatever its address
--   unset                  probe procs whose agent is at a loopback address
--   MONARCH_BULK_SHARED=0  no HostTensor in a memfd (every copy by process_vm)
local ffi = require "ffi"
local core = require "monarch.core"
local runtime = require "monarch.runtime"

local M = {}

--- Chunks and bytes moved each way since the start: tests and benchmarks
-- read it to see which path a transfer took.
M.stats = { local_puts = 0, local_fetches = 0, tcp_puts = 0, tcp_fetches = 0, local_bytes = 0, tcp_bytes = 0 }

--- Bytes per __bulk_ call. A call is the unit of ordering, progress and
-- cancellation, as M.CHUNK is over TCP; the proc's threads copy it in 4 MiB
-- pieces (MN_BULK_PIECE) and see a cancel between them.
M.CHUNK = 32 * 1024 * 1024

--- Seconds a transfer waits for a proc's probe still in flight before it
-- takes TCP this once. The probe is the proc's first call, so it is only
-- ever behind the connection itself.
M.PROBE_WAIT = 2

--- HostTensors of at least this many bytes live in shared memory (a
-- memfd); below, the kernel's copy costs little next to the call itself.
M.SHARED_MIN = 16 * 1024 * 1024

--- Most shared HostTensors alive at once: each holds a file descriptor.
-- Beyond, after a garbage collection has not made room, they are plain memory.
M.SHARED_MAX = 256

--- Bytes of shared HostTensors allowed before a garbage collection runs,
-- at least: the collector does not see memory it did not allocate, so a
-- loop that drops big HostTensors would otherwise grow without bound. The
-- allowance is twice what was still alive after the last collection.
M.SHARED_SLACK = 1024 * 1024 * 1024

for _, d in ipairs {
  "int memfd_create(const char *, unsigned int);", "int ftruncate(int, int64_t);",
  "void *mmap(void *, size_t, int, int, int, int64_t);", "int munmap(void *, size_t);", "int close(int);",
  "int fallocate(int, int, int64_t, int64_t);",
} do pcall(ffi.cdef, d) end -- another module may have declared some

local C = ffi.C
local MFD_CLOEXEC, PROT_RW, MAP_SHARED = 1, 3, 1
local FALLOC_PUNCH_HOLE = 3 -- FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
local MAP_FAILED = ffi.cast("void *", -1)
local shared = { live = 0, bytes = 0, kept = 0 } -- kept: bytes alive after the last collection

--- Memory for a HostTensor of nbytes (>= M.SHARED_MIN): a `ctype *` over a
-- fresh memfd, zero-filled, and its fd; nil when there is none to be had
-- (then the caller takes plain memory). The memory goes with the pointer:
-- when it is collected, the pages are punched out of the file first, so
-- they go back at once even while a proc still maps it.
function M.shared(ctype, nbytes)
  if os.getenv("MONARCH_BULK_SHARED") == "0" then return nil end
  if shared.bytes + nbytes > math.max(M.SHARED_SLACK, 2 * shared.kept) or shared.live >= M.SHARED_MAX then
    collectgarbage()
    shared.kept = shared.bytes
    if shared.live >= M.SHARED_MAX then return nil end
  end
  local fd = C.memfd_create("monarch-host-tensor", MFD_CLOEXEC)
  if fd < 0 then return nil end
  local p = C.ftruncate(fd, nbytes) == 0 and C.mmap(nil, nbytes, PROT_RW, MAP_SHARED, fd, 0) or MAP_FAILED
  if p == MAP_FAILED then
    C.close(fd)
    return nil
  end
  shared.live, shared.bytes = shared.live + 1, shared.bytes + nbytes
  local data = ffi.gc(ffi.cast(ctype .. "*", p), function(q)
    -- Failures here leave only what close frees anyway: nothing to report from a finalizer.
    C.fallocate(fd, FALLOC_PUNCH_HOLE, 0, nbytes)
    C.munmap(q, nbytes)
    C.close(fd)
    shared.live, shared.bytes = shared.live - 1, shared.bytes - nbytes
  end)
  return data, fd
end

local function address(cdata) return tonumber(ffi.cast("uintptr_t", cdata)) end

local function on_this_host(addr)
  return addr == "localhost" or addr == "::1" or (type(addr) == "string" and addr:match("^127%.") ~= nil)
end

--- Asks proc p (just connected) whether it can copy our memory; sets
-- p.bulk to true, false, or "probing" until the answer comes, and
-- p.bulk_why to the reason for false.
-- Whether p is worth probing; if not, p.bulk is false and p.bulk_why says why.
local function probe_worth(p)
  local mode = os.getenv("MONARCH_BULK_LOCAL")
  p.bulk, p.bulk_why = false, nil
  if mode == "0" then
    p.bulk_why = "MONARCH_BULK_LOCAL=0"
    return false
  end
  if mode ~= "1" and not on_this_host(p.addr) then
    p.bulk_why = "its agent is not at a loopback address (MONARCH_BULK_LOCAL=1 probes it anyway)"
    return false
  end
  return true
end

-- Probes procs (all worth it) with one call: through their agents for a large mesh, so that no
-- direct link is opened for it.
local function probe_all(procs)
  local pid, addr, cookie = core.bulk_self()
  local conns = {}
  for i, p in ipairs(procs) do p.bulk, conns[i] = "probing", p.conn end
  local rec = runtime.submit(procs, "__bulk_probe", { pid, addr, cookie }, 3, {
    mode = "mesh", make_result = function() return true end, bypass = true, what = "same-host bulk probe",
    on_slot = function(slot, ok, v)
      local p = procs[slot]
      if p.conn ~= conns[slot] then return end -- answered for a connection the proc has since replaced
      p.bulk = ok and v == true
      if not p.bulk then p.bulk_why = ok and type(v) == "table" and tostring(v[2]) or tostring(v) end
    end,
  })
  rec.internal = true -- the runtime's own: its failure is no sign that the script heard of a death
  rec.future:on_done(function() end) -- each slot's answer was taken above
end

function M.probe(p)
  -- No link of its own (port 0: reached through its host agent only, a simulated proc): nothing to
  -- ask, and no field to spend on a proc of which a mesh holds thousands.
  if p.port == 0 then return end
  -- A proc of a large mesh is probed at its first transfer, with the others (M.local_set): probed now,
  -- one at a time, each would want a direct link of its own.
  if p.pooled then
    p.bulk = nil
    return
  end
  if probe_worth(p) then probe_all({ p }) end
end

--- The procs of `procs` whose transfers go local now, as a set; waits
-- (pumping) for probes still in flight, up to M.PROBE_WAIT.
function M.local_set(procs)
  local set, deadline, todo = {}, nil, {}
  for _, p in ipairs(procs) do
    if p.pooled and p.bulk == nil and p.state == "ready" and probe_worth(p) then todo[#todo + 1] = p end
  end
  if #todo > 0 then probe_all(todo) end
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
-- addrs[i] here; holds[i] is kept alive until that proc answers. Where
-- holds[i] is a shared HostTensor the call names its memfd too, and the
-- proc copies through its map of it.
-- Returns the deepest queue.
function M.queue(id, kernel, procs, tensor, off, len, addrs, holds)
  local pid, caddr, cookie = core.bulk_self()
  local deepest = 0
  for i, p in ipairs(procs) do
    local h = holds[i]
    local fd = type(h) == "table" and rawget(h, "_fd")
    local d, err
    if fd then
      d, err = core.call_as(id, p.conn, i, kernel, tensor, off, len, addrs[i], pid, caddr, cookie, fd, addrs[i] - address(h.data))
    else
      d, err = core.call_as(id, p.conn, i, kernel, tensor, off, len, addrs[i], pid, caddr, cookie)
    end
    if d then
      core.hold(id, i, p.conn, h)
      if d > deepest then deepest = d end
    else -- not queued (its connection closed before we heard, or no memory): the slot fails now
      runtime.fail_slot(id, i, runtime.unqueued_error(kernel, p, err))
    end
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
