-- bench/stats.lua: what the benchmarks share (run from the repository root,
-- where "./?.lua" finds it): local median = require("bench.stats").median
local M = {}

--- The median of a list of numbers (sorts it in place).
function M.median(xs)
  table.sort(xs)
  local n = #xs
  return n % 2 == 1 and xs[(n + 1) / 2] or (xs[n / 2] + xs[n / 2 + 1]) / 2
end

return M
