-- bench/kcoll.lua: in-rank collective timing. A kernel (kcoll's kc_bench)
-- loops the collective back to back inside every proc and returns its own
-- seconds per call, timed the way bench/mpi_allreduce.c times MPI_Allreduce
-- (a barrier, then `batch` calls, the median of several batches; rank 0's
-- figure), so no controller round trip is in it. Run by bench/kcoll.sh:
--   monarch-run bench/kcoll.lua [max_bytes] [procs...] [what]
-- what: all_reduce (default), broadcast, all_gather, reduce_scatter, barrier.
-- Prints, in the format of bench/mpi_allreduce.c (busbw by the nccl-tests
-- formula for all_reduce: algbw * 2(n-1)/n):
--   allreduce <procs> <bytes> <time_us> <algbw_GBps> <busbw_GBps>
local monarch = require "monarch"

local MIN_BYTES = 1024
local MAX_BYTES = tonumber(arg and arg[1]) or 256 * 1024 * 1024
local BATCH_BYTES = 64 * 1024 * 1024 -- a batch moves about this much, at least one call (as mpi_allreduce.c)
local MAX_BATCH = 100                 -- most calls in one batch
local BATCHES_SMALL, BATCHES_BIG = 7, 3 -- batches per size, up to / above 16 MiB

local counts, what = {}, "all_reduce"
for i = 2, #(arg or {}) do
  if tonumber(arg[i]) then counts[#counts + 1] = tonumber(arg[i]) else what = arg[i] end
end
if #counts == 0 then counts = { 2, 4 } end

local maxn = 0
for _, n in ipairs(counts) do maxn = math.max(maxn, n) end
local all = monarch.hosts():spawn_procs{ procs = maxn }
all:load "kcoll"

for _, n in ipairs(counts) do
  local procs = all:slice{ procs = { 0, n } }
  local g = procs:group()
  local bytes = MIN_BYTES
  while bytes <= MAX_BYTES do
    local t = procs:tensor("f32", { bytes / 4 })
    local big = (what == "all_gather" or what == "reduce_scatter") and procs:tensor("f32", { n * bytes / 4 }) or t
    local batch = math.max(1, math.min(MAX_BATCH, math.floor(BATCH_BYTES / bytes)))

    local nb = bytes > 16 * 1024 * 1024 and BATCHES_BIG or BATCHES_SMALL
    local r = procs:call("kc_bench", g, what, t, big, batch, nb):get()
    local s = r[1] -- rank 0's own median, as MPI's figure is rank 0's
    local algbw = bytes / s / 1e9
    local factor = what == "all_reduce" and 2 * (n - 1) / n or 1
    print(string.format("allreduce %d %d %.2f %.3f %.3f", n, bytes, s * 1e6, algbw, algbw * factor))
    io.stdout:flush()
    t:free()
    if big ~= t then big:free() end
    bytes = bytes * 4
  end
  g:free()
end
monarch.shutdown()
