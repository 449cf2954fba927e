-- The job tests/integration/join_spec.lua runs under monarch-run: it waits
-- for a host to join (by the join port, or with `refresh HOSTFILE ADDR` by
-- a line it adds to its --hostfile), grows its mesh onto it and hands the
-- new procs a tensor from a peer, printing what the spec checks.
--   monarch-run --listen-joins 127.0.0.1:0 tests/support/join_job.lua join
--   monarch-run --hostfile F tests/support/join_job.lua refresh F HOST:PORT
local monarch = require "monarch"
local bulk = require "monarch.bulk"

local mode = arg[1]
local hosts = monarch.hosts()
local joined = {}
hosts:on_join(function(a) joined[#joined + 1] = a end)
local procs = hosts:spawn_procs { procs = 2 }
procs:load "basic"
local w = procs:tensor("f64", { 4096 })
procs:call("iota", w, 1):get() -- 1..4096 on the old procs: sum 8390656
local kept = procs:tensor("f64", { 8 }) -- a tensor that stays on the old procs

if mode == "refresh" then
  local f = assert(io.open(arg[2], "a"))
  f:write(arg[3], "  # added while the job runs\n")
  f:close()
  print("refreshed " .. #hosts:refresh())
else
  print("waiting for a host")
end
io.stdout:flush()
local deadline = monarch.now() + 120
while #joined == 0 and monarch.now() < deadline do monarch.sleep(0.05) end
assert(#joined == 1, "no host joined in 120 s")
print("hosts " .. hosts:size())

local grown, added = procs:grow(joined)
print(string.format("grown %d hosts x %d procs = %d", grown:size("hosts"), grown:size("procs"), grown:size()))
local ranks = {}
for _, v in ipairs(added:call("rank"):get():values()) do ranks[#ranks + 1] = v[1] .. "/" .. v[2] end
print("new ranks " .. table.concat(ranks, " "))

local moved = bulk.stats.tcp_bytes + bulk.stats.local_bytes
w:copy_from_peer(grown, { from = 1 }):get()
print("controller bytes " .. (bulk.stats.tcp_bytes + bulk.stats.local_bytes - moved))
local sums = {}
for _, v in ipairs(grown:call("sum", w):get():values()) do sums[#sums + 1] = string.format("%.0f", v) end
print("sums " .. table.concat(sums, " "))
-- The grown mesh is an ordinary mesh: a collective over all of it, and a tensor of its own.
grown:all_reduce(w, "sum"):get()
print(string.format("all_reduce %.0f", grown:slice { hosts = 1, procs = 1 }:call_one("sum", w):get()))
print("kept on " .. #kept.mesh:proc_list())
