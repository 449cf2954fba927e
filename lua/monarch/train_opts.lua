--- The command line of a training script (monarch.train): the library's
-- own options beside the script's, parsed from `arg`, with --help.
-- An option is { name, default, kind, help } with kind "int", "number",
-- "string" or "flag", and optionally min = the least value; a script's option of the same name as one of ours
-- replaces ours (its default, say), so `{ "epochs", 300, "int", ... }`
-- changes the default only.
local plot = require "monarch.plot"

local M = {}

--- The options every training script has (docs/training.md, "Options").
M.COMMON = {
  { "procs", 4, "int", "procs to train on (on each host)" },
  { "epochs", 20, "int", "passes over the training data" },
  { "steps", nil, "int", "total steps instead of --epochs (for short runs)" },
  { "seed", 1, "int", "seed of everything random (data order, initial weights)" },
  { "checkpoint-dir", "checkpoints", "string", "directory for checkpoints" },
  { "every", 100, "int", "steps between checkpoints (0: no checkpoints)" },
  { "keep", 3, "int", "checkpoints kept" },
  { "resume", false, "flag", "continue from the newest valid checkpoint in --checkpoint-dir" },
  { "resume-from", nil, "string", "continue from this checkpoint file" },
  { "snapshot-every", 1, "int", "steps between the procs' own copies of the state (for recovery)" },
  { "log-every", 20, "int", "steps between progress lines when stdout is not a terminal" },
  { "quiet", false, "flag", "print only the summary" },
  { "plot", nil, "string", "SVG file for a line plot of the figures of every step" },
  { "csv", nil, "string", "CSV file for the figures of every step" },
  { "job", nil, "string", "name of the job on the host agents (default: the script's name)" },
  { "standby", false, "flag", "wait for the job's controller to die, then take it over" },
  { "fresh", false, "flag", "end a job of the same name left on the agents and start anew" },
  { "fail-at", nil, "int", "testing: fail step N once (simulated) to exercise recovery" },
  { "kill-at", nil, "int", "testing: kill the last proc at step N (needs restart support)" },
  { "kill-host-at", nil, "int", "testing: kill the last host's agent (and so its procs) at step N" },
  { "wait-join-at", nil, "int", "testing: at step N, wait (up to 60 s) until a host has joined (--listen-joins)" },
  { "die-at", nil, "int", "testing: the controller kills itself (SIGKILL) at step N" },
  { "die-in", "step", "string", "testing: where --die-at kills: step (a collective in flight) or checkpoint" },
  { "help", false, "flag", "show this help" },
}

-- Options that must be at least 1 (or 0), whichever script defines them.
local AT_LEAST = { procs = 1, epochs = 1, steps = 1, every = 0, keep = 1, ["snapshot-every"] = 1, ["log-every"] = 1 }

--- The library's options merged with the script's: a list in help order (the script's first).
function M.merge(own)
  local list, index = {}, {}
  for _, o in ipairs(own or {}) do
    if type(o) ~= "table" or type(o[1]) ~= "string" or not ({ int = 1, number = 1, string = 1, flag = 1 })[o[3]] then
      error("train: an option is { name, default, kind (int, number, string, flag), help }, got " .. tostring(o[1]), 3)
    end
    list[#list + 1], index[o[1]] = o, #list + 1
  end
  for _, o in ipairs(M.COMMON) do
    if not index[o[1]] then list[#list + 1], index[o[1]] = o, #list + 1 end
  end
  return list
end

--- The help text: a usage line, the script's summary, and one line per option.
function M.usage(script, about, list)
  local lines = { "usage: monarch-run " .. script .. " [options]" }
  if about then lines[#lines + 1] = about end
  lines[#lines + 1] = ""
  for _, o in ipairs(list) do
    local name = "--" .. o[1] .. (o[3] == "flag" and "" or " " .. o[3]:upper())
    local def = (o[2] ~= nil and o[3] ~= "flag") and string.format(" (default %s)", tostring(o[2])) or ""
    lines[#lines + 1] = string.format("  %-26s %s%s", name, o[4] or "", def)
  end
  return table.concat(lines, "\n")
end

-- The value of option o from the text v; raises a message naming it.
local function value_of(o, v, fail)
  if o[3] == "string" then return v end
  local n = tonumber(v)
  if not n or (o[3] == "int" and n ~= math.floor(n)) then
    fail(string.format("--%s wants %s, got '%s'", o[1], o[3] == "int" and "an integer" or "a number", v))
  end
  return n
end

--- Parses argv against list; fail(msg) is called (and must not return) for a mistake. Returns the options by name.
function M.parse(argv, list, fail)
  local opts, spec = {}, {}
  for _, o in ipairs(list) do
    opts[o[1]], spec[o[1]] = o[2], o
  end
  local i = 1
  while argv[i] do
    local a = argv[i]
    local name, inline = a:match("^%-%-([%w%-]+)=(.*)$")
    name = name or a:match("^%-%-([%w%-]+)$")
    local o = name and spec[name]
    if not o then fail("unknown argument '" .. a .. "' (--help lists the options)") end
    if o[3] == "flag" then
      if inline then fail("--" .. name .. " takes no value") end
      opts[name] = true
    else
      local v = inline or argv[i + 1]
      if v == nil then fail("--" .. name .. " needs a value") end
      if not inline then i = i + 1 end
      opts[name] = value_of(o, v, fail)
    end
    i = i + 1
  end
  for _, o in ipairs(list) do
    local lo = o.min or AT_LEAST[o[1]]
    if lo and opts[o[1]] ~= nil and opts[o[1]] < lo then fail(string.format("--%s must be at least %s", o[1], lo)) end
  end
  -- A bad output path stops the run now, not after the training.
  for _, name in ipairs { "plot", "csv" } do
    if opts[name] then
      local ok, err = plot.writable(opts[name])
      if not ok then fail("--" .. name .. ": " .. err) end
    end
  end
  return opts
end

--- The options that make a run what it is (all but those that only say how it is run or shown): two controllers
-- of one job must agree on these. Returns a sorted list of "name=value" strings.
local HOW = { quiet = 1, plot = 1, csv = 1, ["log-every"] = 1, resume = 1, ["resume-from"] = 1, standby = 1,
  fresh = 1, help = 1, job = 1, ["fail-at"] = 1, ["kill-at"] = 1, ["kill-host-at"] = 1, ["wait-join-at"] = 1,
  ["die-at"] = 1, ["die-in"] = 1, ["checkpoint-dir"] = 1, every = 1, keep = 1, epochs = 1, steps = 1 }
function M.identity(opts, list)
  local out = {}
  for _, o in ipairs(list) do
    if not HOW[o[1]] and opts[o[1]] ~= nil then out[#out + 1] = o[1] .. "=" .. tostring(opts[o[1]]) end
  end
  table.sort(out)
  return out
end

return M
