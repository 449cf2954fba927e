-- bench/bulk.lua: controller <-> proc bulk transfer, GB/s (median of runs,
-- after a warm-up run so that first-touch page faults are not counted: the
-- raw TCP baseline reuses its buffers the same way).
--   monarch-run bench/bulk.lua [MiB] [runs]
local monarch = require "monarch"
local mib = tonumber(arg[1]) or 256
local runs = tonumber(arg[2]) or 5

local function median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2
end

local procs = monarch.hosts():spawn_procs{ procs = 1 }
procs:load "basic"
local n = mib * 1024 * 1024
local t = procs:tensor("u8", { n })
local src = monarch.tensor.host("u8", { n })
for i = 1, n, 4096 do src[i] = i % 251 end
local into = t:fetch():get()
local puts, fetches = {}, {}
for r = 0, runs do
  local t0 = monarch.now()
  t:put(src):get()
  local tp = monarch.now() - t0
  t0 = monarch.now()
  t:fetch(into):get()
  local tf = monarch.now() - t0
  if r > 0 then
    puts[r], fetches[r] = n / tp / 1e9, n / tf / 1e9
  end
end
assert(into[1][4097] == src[4097], "fetched bytes differ from what was put")
print(string.format("put_gbs %.3f", median(puts)))
print(string.format("fetch_gbs %.3f", median(fetches)))
