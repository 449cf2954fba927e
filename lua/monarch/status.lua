--- monarch.status(): what the host agents know, for `monarch-run --status --hosts ...`:
-- each host, the BLAS core type its procs run, its procs (state, uptime, calls queued and run, the kernel
-- running now) and the procs that exited recently.
local core = require "monarch.core"
local persist = require "monarch.persist"

local M = {}

local function duration(s)
  if s < 60 then return string.format("%.0fs", s) end
  if s < 3600 then return string.format("%.0fm%02.0fs", math.floor(s / 60), s % 60) end
  return string.format("%.0fh%02.0fm", math.floor(s / 3600), math.floor(s % 3600 / 60))
end

-- OpenBLAS's oldest kernels, which it falls back to on a CPU model it does not know: "generic" here.
local GENERIC = { prescott = true, core2 = true, katmai = true, coppermine = true, northwood = true, banias = true,
  atom = true, generic = true, ["?"] = true }

--- Whether core (openblas_get_corename()) is one of OpenBLAS's generic fallbacks rather than a kernel
-- tuned for a recent core.
function M.blas_generic(core) return GENERIC[tostring(core):lower()] == true end

--- The line of a host's BLAS: the OpenBLAS core type its procs run and its one-core sgemm rate, or nil
-- (an agent from before the field, or a simulated one).
function M.blas_line(b)
  if type(b) ~= "table" or b.core == "?" and not b.note then return nil end
  local line = string.format("blas %s (%s%s) %.1f GFLOP/s", b.core, b.source, b.cached and ", cached" or "",
    b.gflops or 0)
  if b.openblas and b.openblas:lower() ~= b.core:lower() then
    line = line .. string.format("; OpenBLAS's own %s %.1f GFLOP/s", b.openblas, b.openblas_gflops or 0)
  end
  return line
end

--- What was measured: "measured (one core, ...): Zen 41.8, HASWELL 53.3, SKYLAKEX killed by SIGILL", or nil.
function M.blas_measured(b)
  if type(b) ~= "table" or type(b.tried) ~= "table" or #b.tried == 0 then return nil end
  local parts = {}
  for i, t in ipairs(b.tried) do
    local name = i == 1 and "own " .. t.core or (t.name ~= "" and t.name or t.core)
    parts[#parts + 1] = t.ok and string.format("%s %.1f", name, t.gflops) or (name .. " failed (" .. tostring(t.why) .. ")")
  end
  return string.format("measured (OpenBLAS %s, one core, GFLOP/s at our kernels' shapes): %s", tostring(b.version),
    table.concat(parts, ", "))
end

--- Why a host's procs run OpenBLAS's own choice rather than a core type picked for the CPU, or nil; and
-- it says so first where that choice is one of OpenBLAS's generic kernels.
function M.blas_why(b)
  if type(b) ~= "table" then return nil end
  local generic = b.core and b.core ~= "?" and M.blas_generic(b.core)
  if not b.note and not generic then return nil end
  local own = b.source == "user" and "the core type the user set" or ("OpenBLAS's own " .. tostring(b.openblas))
  local line = string.format("procs run %s: %s", own, b.note or "")
  if generic then
    line = string.format("procs run generic kernels (%s, OpenBLAS's fallback for a CPU it does not know): %s", b.core,
      b.note or "no core type measured faster passed its self-check")
  end
  return line
end

--- The agents' reports: a list of {agent, ok, value}.
function M.collect(agents)
  return persist.ask(agents, function(req) return { core.MSG.STATUS, req } end, "asking for status")
end

--- Prints the report of the script's hosts (monarch.hosts()) to `out` (default stdout).
function M.print(monarch, out)
  out = out or io.stdout
  local hosts = monarch.hosts()
  local replies = M.collect(hosts.agents)
  for _, r in ipairs(replies) do
    local a, v = r.agent, r.value
    if not r.ok then
      out:write(string.format("%s:%d  error: %s\n", a.addr, a.port, tostring(v)))
    else
      out:write(string.format("host %s (%s:%d)  agent pid %d  up %s  %d procs\n", v.hostname, a.addr, a.port,
        v.pid, duration(v.uptime), #v.procs))
      for _, line in ipairs { M.blas_line(v.blas) or false, M.blas_why(v.blas) or false,
        M.blas_measured(v.blas) or false } do
        if line then out:write("  " .. line .. "\n") end
      end
      table.sort(v.procs, function(x, y) return x.rank < y.rank end)
      if #v.procs > 0 then
        out:write(string.format("  %5s %8s %-10s %8s %7s %9s  %s\n", "rank", "pid", "state", "uptime", "queued",
          "executed", "running"))
      end
      for _, p in ipairs(v.procs) do
        out:write(string.format("  %5d %8d %-10s %8s %7d %9d  %s\n", p.rank, p.pid, p.state, duration(p.uptime),
          p.queued, p.executed, p.running))
      end
      if #v.exits > 0 then out:write("  recent exits:\n") end
      for _, e in ipairs(v.exits) do
        local cause = e.signal ~= "" and ("killed by SIG" .. e.signal) or ("exited with code " .. e.status)
        out:write(string.format("    rank %d pid %d %s, %s ago\n", e.rank, e.pid, cause, duration(e.ago)))
      end
    end
  end
  return replies
end

return M
