-- cluster.lua: the first script to run on a new allocation. One host agent
-- per node (started by monarch-run --slurm), a few procs on each, and an
-- all-reduce across all of them, which needs every proc to reach every other.
--   sbatch examples/slurm/train.sbatch             # runs this, then examples/train.lua
--   salloc -N 2 monarch-run --slurm examples/slurm/cluster.lua [procs per host]
local monarch = require "monarch"

local per_host = tonumber(arg and arg[1] or "") or 2

local hosts = monarch.hosts()
print(hosts)
local procs = hosts:spawn_procs { procs = per_host }
procs:load "basic"

for coords, r in procs:call("rank"):get():items() do
  print(string.format("host %d proc %d: rank %d of %d", coords.hosts, coords.procs, r[1], r[2]))
end

-- Every proc holds 1.0; after the sum every proc holds the number of procs.
local world = hosts:size() * per_host
local t = procs:tensor("f64", { 1 })
procs:call("fill", t, 1.0):get()
procs:all_reduce(t, "sum"):get()
local ok = true
for coords, s in procs:call("sum", t):get():items() do
  if s ~= world then
    ok = false
    print(string.format("host %d proc %d holds %g, expected %d", coords.hosts, coords.procs, s, world))
  end
end
print(string.format("all_reduce over %d procs on %d hosts: %s", world, hosts:size(), ok and "ok" or "WRONG"))
if not ok then os.exit(1) end
