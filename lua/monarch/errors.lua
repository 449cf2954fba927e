--- Structured errors: every failure a script sees is a MonarchError.
-- Fields: kind, message, kernel, rank, host, pid, cause. tostring() gives one
-- clear line that names the proc and the kernel.
local M = {}

local MonarchError = {}
MonarchError.__index = MonarchError
MonarchError.__tostring = function(e)
  local where = {}
  if e.rank then where[#where + 1] = "rank " .. tostring(e.rank) end
  if e.host then where[#where + 1] = "host " .. tostring(e.host) end
  if type(e.pid) == "number" and e.pid > 0 then where[#where + 1] = "pid " .. string.format("%d", e.pid) end
  local s = "monarch: " .. tostring(e.kind)
  if e.kernel then s = s .. " in '" .. tostring(e.kernel) .. "'" end
  if #where > 0 then s = s .. " on " .. table.concat(where, ", ") end
  s = s .. ": " .. tostring(e.message)
  if e.others and e.others > 0 then
    s = s .. string.format(" (and %d more failure%s)", e.others, e.others == 1 and "" or "s")
  end
  return s
end

--- Makes an error object. `fields` needs at least kind and message.
function M.new(fields)
  return setmetatable(fields, MonarchError)
end

--- True if v is a MonarchError.
function M.is(v)
  return getmetatable(v) == MonarchError
end

--- Every kind a failure can have, and when it happens: {kind, when} in the
-- order docs/lua-api.md lists them (tests/lua/errors_spec.lua checks that
-- the two lists agree and that every kind the sources raise is here). The
-- first group comes from the procs (in a RESULT), the rest from the controller.
M.KINDS = {
  -- from the proc
  { "kernel", "the kernel reported an error, or returned more than 4096 values (also a failure that came without a kind)" },
  { "bad_args", "the arguments do not fit the kernel's signature, a table was passed, or a built-in failed" },
  { "unknown_kernel", "no loaded library has that kernel" },
  { "lost", "the call's result, or its bulk payload, was lost in a reconnect (the proc's replay cache overflowed); `retries` sends it again" },
  { "actor", "an actor module was not found or does not compile, or an actor's constructor or endpoint raised" },
  { "collective", "a collective or copy failed while running (a peer died, a link broke, the group could not form)" },
  { "collective_mismatch", "the members of a group called different collectives, or the same one with different sizes, dtypes or ops" },
  { "gpu", "a CUDA or NCCL call failed on the proc (allocation, copy, communicator)" },
  { "no_gpu", "the proc has no CUDA runtime or no device" },
  { "bulk", "a same-host put or fetch could not copy the controller's memory although the proc's probe had said it could (the proc's later transfers go over TCP)" },
  { "cancelled", "the call was stopped: `future:cancel()`, a call `timeout`, or Ctrl-C in the REPL (a queued call is dropped before it runs; a running kernel sees its cancel flag)" },
  -- from the controller
  { "proc_failed", "the proc died, or was already dead, before it answered" },
  { "unresponsive", "the proc stopped answering heartbeats while its host agent still answers, or still ran a cancelled call after `cancel_grace` (it is then killed)" },
  { "host_lost", "a host agent is gone for good (its address refuses connections, or it stayed unreachable for the reconnect window), and every proc on it with it: one event per host, with host, addr, cause and ranks" },
  { "timeout", "a call `options` timeout, or a `get(timeout)` or spawn/connect wait ran out" },
  { "load", "`ProcMesh:load` failed" },
  { "spawn", "`spawn_procs` could not start or reach every proc" },
  { "connect", "a host agent could not be reached, or is not connected" },
  { "launch", "a launcher (`--ray`) could not start the job's host agents: the cluster lacks the resources asked for, cannot be reached, or its launcher failed" },
  { "restart", "a proc could not be restarted: its kernels, tensors or `on_restart` hooks failed (raised at the next wait)" },
  { "script", "an `on_failure` handler raised" },
  { "persist", "`persist` or `detach` failed, or a host agent refused it" },
  { "attach", "`monarch.attach` found no such mesh, or could not reach its procs" },
  { "train", "`monarch.train.run(spec, args)` (from a REPL or a notebook) stopped with what would end a script in one line: a bad option, a job another controller holds, too many failed steps" },
  { "memory", "the controller ran out of memory queueing a call: the slots it could not queue fail with this kind and were not sent (the others run)" },
  { "interrupted", "Ctrl-C in the REPL stopped a wait (the call a `get` waited for is cancelled; other calls go on)" },
  { "error", "inside an actor only: a mesh call it made raised a plain (non-Monarch) error on the controller" },
}

--- kind -> when it happens, for every kind of M.KINDS.
M.KIND = {}
for _, k in ipairs(M.KINDS) do M.KIND[k[1]] = k[2] end

M.MonarchError = MonarchError
return M
