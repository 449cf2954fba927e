-- The job tests/integration/ray_spec.lua and bench/ray.sh run under
-- `monarch-run --ray`: 2 procs on every host Ray gave, one mesh-wide call,
-- then (with a number of seconds as arg[1]) a wait, so a test can kill the
-- controller while the hosts are up.
--   monarch-run --ray ADDR tests/support/ray_job.lua [SECONDS]
local monarch = require "monarch"
local t0 = monarch.now()
local hosts = monarch.hosts()
local procs = hosts:spawn_procs { procs = 2 }
procs:load "basic"
local ranks = procs:call("rank"):get()
print(string.format("hosts %d procs %d first call %.3f s", hosts:size(), #ranks:values(), monarch.now() - t0))
io.stdout:flush()
if arg[1] then monarch.sleep(tonumber(arg[1])) end
