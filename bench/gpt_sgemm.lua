-- bench/gpt_sgemm.lua: one proc's sgemm FLOP/s (gpt_sgemm_flops, one OpenBLAS thread), for bench/gpt.sh.
--   monarch-run bench/gpt_sgemm.lua [n]     prints: sgemm_flops <FLOP/s> n <n>
local monarch = require "monarch"
local n = tonumber(arg and arg[1]) or 512
local p = monarch.hosts():spawn_procs { procs = 1 }
p:load "gpt"
local f = p:call("gpt_sgemm_flops", n, 4, 7):get()[1]
print(string.format("sgemm_flops %.4g n %d", f, n))
monarch.shutdown()
