-- tests/support/order.lua: checks that every proc ran its calls in submission order, once each, with
-- faulty's bump (each call returns the proc's count after it).
--
--   local order = require "support.order"
--   local seen = order.check(futs, base)  -- futs: {all = true, f = mesh-wide future} or {rank = r, f = call_one future}
local assert = require "luassert" -- a module's globals are not a spec's: busted's assert is luassert
local M = {}

--- base[i]: rank i-1's count before futs; returns seen[rank], each rank's count after them.
function M.check(futs, base, seen)
  seen = seen or {}
  for _, e in ipairs(futs) do
    if e.all then
      for rank, v in ipairs(e.f:get(10):values()) do
        local want = (seen[rank - 1] or base[rank]) + 1
        assert.are.equal(want, v[1], "proc " .. (rank - 1) .. " ran a cast out of order")
        seen[rank - 1] = want
      end
    else
      local want = (seen[e.rank] or base[e.rank + 1]) + 1
      assert.are.equal(want, e.f:get(10)[1], "proc " .. e.rank .. " ran a single call out of order")
      seen[e.rank] = want
    end
  end
  return seen
end

return M
