-- tests/support/digits.lua: the data set for specs that run examples/train.lua.
-- The real one (data/digits.csv.gz, git-ignored) when it is here or can be
-- fetched; otherwise a digits-like synthetic set, for machines offline.
--   local data_arg = require("support.digits").data_arg(dir)   -- "" or " --data DIR/synthetic.csv"
local M = {}

local function exists(p)
  local f = io.open(p, "rb")
  if f then f:close() end
  return f ~= nil
end

--- Writes 900 rows of 10 noisy prototypes (64 values in 0..16, then the
-- label) to path; plain CSV, which the loader reads as well as gzip.
function M.synthetic(path)
  local state = 12345
  local function rand(n) -- a small LCG: deterministic everywhere
    state = (state * 1103515245 + 12345) % 2147483648
    return state % n
  end
  local protos = {}
  for c = 0, 9 do
    protos[c] = {}
    for j = 1, 64 do protos[c][j] = rand(17) end
  end
  local lines = {}
  for r = 0, 899 do
    local c = r % 10
    local row = {}
    for j = 1, 64 do row[j] = math.max(0, math.min(16, protos[c][j] + rand(9) - 4)) end
    row[65] = c
    lines[#lines + 1] = table.concat(row, ",")
  end
  local f = assert(io.open(path, "wb"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
end

--- The --data argument for train.lua: "" when the real set is here (fetched
-- by scripts/fetch-digits.sh if need be), else " --data FILE" for a
-- synthetic set written into dir, with a note on stderr saying why.
function M.data_arg(dir)
  if exists("data/digits.csv.gz") then return "" end
  local f = io.popen("scripts/fetch-digits.sh 2>&1; echo \"::rc=$?\"")
  local out = f:read("*a")
  f:close()
  if out:match("::rc=0%s*$") and exists("data/digits.csv.gz") then return "" end
  io.stderr:write("the digits data set is not available (", (out:gsub("\n", " ")), "); using a synthetic one\n")
  local p = dir .. "/synthetic.csv"
  M.synthetic(p)
  return " --data " .. p
end

return M
