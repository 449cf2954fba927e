-- bench/allreduce.lua: CPU all_reduce bus bandwidth (the nccl-tests formula:
-- algbw = bytes / time, busbw = algbw * 2(n-1)/n) on 2 and 4 procs, and
-- proc-to-proc copy bandwidth. Run by bench/collective.sh under monarch-run:
--   monarch-run bench/allreduce.lua [max_bytes] [procs...]
--   monarch-run --hosts A,B bench/allreduce.lua [max_bytes] per_host:2
-- (the second form: that many procs on every host, one all_reduce over all
-- of them; bench/hosts.sh uses it for two hosts on one machine)
-- Prints, in the format of bench/mpi_allreduce.c:
--   allreduce <procs> <bytes> <time_us> <algbw_GBps> <busbw_GBps>
--   copy <bytes> <time_us> <GBps>
-- Each size runs as batches of back-to-back calls (time / calls) issued
-- without waiting in between, like a training step; the median batch counts.
local monarch = require "monarch"

local MIN_BYTES = 1024
local MAX_BYTES = tonumber(arg and arg[1]) or 256 * 1024 * 1024
local BATCH_BYTES = 64 * 1024 * 1024 -- a batch moves about this much, at least one call
local MAX_BATCH = 100                 -- most calls in one batch
local BATCHES_SMALL, BATCHES_BIG = 7, 3 -- batches per size, up to / above 16 MiB

local counts, per_host = {}, nil
for i = 2, #(arg or {}) do
  per_host = per_host or tonumber(tostring(arg[i]):match("^per_host:(%d+)$"))
  counts[#counts + 1] = tonumber(arg[i])
end
if #counts == 0 and not per_host then counts = { 2, 4 } end

local function median(xs)
  table.sort(xs)
  return xs[math.floor((#xs + 1) / 2)]
end

local maxn = 0
for _, n in ipairs(counts) do maxn = math.max(maxn, n) end
local all = monarch.hosts():spawn_procs{ procs = per_host or maxn }
all:load "basic"
local meshes = {}
if per_host then
  meshes[1] = { all, all:size() }
else
  for i, n in ipairs(counts) do meshes[i] = { all:slice{ procs = { 0, n } }, n } end
end

for _, pair in ipairs(meshes) do
  local procs, n = pair[1], pair[2]
  local bytes = MIN_BYTES
  while bytes <= MAX_BYTES do
    local t = procs:tensor("f32", { bytes / 4 })
    local batch = math.max(1, math.min(MAX_BATCH, math.floor(BATCH_BYTES / bytes)))
    local times = {}
    procs:call("fill", t, 1):get()
    procs:all_reduce(t, "sum"):get() -- warm up (and set the group up)
    for b = 1, bytes > 16 * 1024 * 1024 and BATCHES_BIG or BATCHES_SMALL do
      procs:call("fill", t, 1):get() -- keep the sums finite
      local t0 = monarch.now()
      local last
      for _ = 1, batch do last = procs:all_reduce(t, "sum") end
      last:get() -- every proc runs its calls in order: the last done means all done
      times[b] = (monarch.now() - t0) / batch
    end
    local s = median(times)
    local algbw = bytes / s / 1e9
    print(string.format("allreduce %d %d %.1f %.3f %.3f", n, bytes, s * 1e6, algbw, algbw * 2 * (n - 1) / n))
    io.stdout:flush()
    t:free()
    bytes = bytes * 4
  end
end

if per_host then
  monarch.shutdown()
  return
end

-- Proc-to-proc copy: rank 0's tensor into rank 1's, directly between them.
local two = all:slice{ procs = { 0, 2 } }
for _, bytes in ipairs({ 1024 * 1024, 16 * 1024 * 1024, 256 * 1024 * 1024 }) do
  if bytes <= MAX_BYTES then
    local src, dst = two:tensor("u8", { bytes }), two:tensor("u8", { bytes })
    two:copy(src, { procs = 0 }, dst, { procs = 1 }):get()
    local times = {}
    local reps = math.max(1, math.min(20, math.floor(BATCH_BYTES / bytes)))
    for b = 1, 5 do
      local t0 = monarch.now()
      local last
      for _ = 1, reps do last = two:copy(src, { procs = 0 }, dst, { procs = 1 }) end
      last:get()
      times[b] = (monarch.now() - t0) / reps
    end
    local s = median(times)
    print(string.format("copy %d %.1f %.3f", bytes, s * 1e6, bytes / s / 1e9))
    io.stdout:flush()
    src:free()
    dst:free()
  end
end
monarch.shutdown()
