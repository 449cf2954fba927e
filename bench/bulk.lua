-- bench/bulk.lua: controller <-> proc bulk transfer, GB/s (median of runs,
-- after a warm-up run so that first-touch page faults are not counted), next
-- to memcpy of the same size between two warm buffers in this process, in
-- the same run (the baseline of the ratios). The path taken (same-host copy
-- or TCP: MONARCH_BULK_LOCAL, docs/lua-api.md) is printed with the figures,
-- and so are the first put (the proc maps the source then) and the first
-- fetch (into a fresh HostTensor, whose pages are new), outside the medians.
--   monarch-run bench/bulk.lua [MiB] [runs]
local ffi = require "ffi"
local monarch = require "monarch"
local bulk = require "monarch.bulk"
local mib = tonumber(arg[1]) or 256
local runs = tonumber(arg[2]) or 5

local median = require("bench.stats").median

local procs = monarch.hosts():spawn_procs{ procs = 1 }
procs:load "basic"
local n = mib * 1024 * 1024
local t = procs:tensor("u8", { n })
local src = monarch.tensor.host("u8", { n })
for i = 1, n, 4096 do src[i] = i % 251 end
local t0 = monarch.now()
local into = t:fetch():get()
local fresh = monarch.now() - t0
local copy = monarch.tensor.host("u8", { n })
local puts, fetches, copies, first_put = {}, {}, {}, nil
for r = 0, runs do
  local t0 = monarch.now()
  ffi.copy(copy.data, src.data, n)
  local tc = monarch.now() - t0
  t0 = monarch.now()
  t:put(src):get()
  local tp = monarch.now() - t0
  t0 = monarch.now()
  t:fetch(into):get()
  local tf = monarch.now() - t0
  if r > 0 then
    puts[r], fetches[r], copies[r] = n / tp / 1e9, n / tf / 1e9, n / tc / 1e9
  else
    first_put = tp
  end
end
assert(into[1][4097] == src[4097] and into[1][n - 4095] == src[n - 4095], "fetched bytes differ from what was put")
local p = procs:proc_list()[1]
local put, fetch, mc = median(puts), median(fetches), median(copies)
print(string.format("path %s", p.bulk == true and "local" or ("tcp (" .. tostring(p.bulk_why) .. ")")))
print(string.format("memcpy_gbs %.3f", mc))
print(string.format("put_gbs %.3f", put))
print(string.format("fetch_gbs %.3f", fetch))
print(string.format("put_ratio %.2f", put / mc))
print(string.format("fetch_ratio %.2f", fetch / mc))
print(string.format("local_chunks %d", bulk.stats.local_puts + bulk.stats.local_fetches))
print(string.format("first_put_ratio %.2f", n / first_put / 1e9 / mc))
print(string.format("fresh_fetch_ratio %.2f", n / fresh / 1e9 / mc))
