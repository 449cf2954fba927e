-- examples/gpt.lua as a user runs it (real monarch-run, procs, collectives),
-- on a tiny model so that each run takes seconds: tensor parallel gives the
-- losses of one proc, data parallel those of one proc with the whole batch,
-- bad sizes are refused in one line, and a proc killed mid-run at dp = 2,
-- tp = 2 ends with every proc's state bitwise that of an uninterrupted run.
local shell = require "support.shell"

local B = os.getenv("MONARCH_BUILD") or "build"
local TINY = "--layers 2 --heads 2 --width 32 --context 16 --eval-windows 4 --every 0 --warmup 5"

local dirs = {}
local function gpt(args)
  return shell.run(("OPENBLAS_NUM_THREADS=1 timeout 120 %s/bin/monarch-run examples/gpt.lua %s %s 2>&1")
    :format(B, TINY, args))
end

-- The loss column of a run's --csv.
local function losses(args)
  local f = os.tmpname()
  dirs[#dirs + 1] = f
  local out, rc = gpt(args .. " --quiet --csv " .. f)
  assert.are.equal(0, rc, out)
  local l = {}
  for line in io.lines(f) do
    local v = line:match("^%d+,%d+,([^,]+),")
    if v then l[#l + 1] = tonumber(v) end
  end
  return l, out
end

local function close(a, b, rel)
  assert.are.equal(#a, #b)
  for i = 1, #a do
    if math.abs(a[i] - b[i]) > rel * math.abs(b[i]) then
      error(string.format("step %d: %.9g against %.9g (more than %g relative)", i, a[i], b[i], rel))
    end
  end
end

describe("examples/gpt.lua", function()
  teardown(function() for _, f in ipairs(dirs) do os.remove(f) end end)

  it("gives the losses of tp = 1 with tp = 2 for 50 steps", function()
    local one = losses("--steps 50 --batch 4 --dp 1 --tp 1")
    local two = losses("--steps 50 --batch 4 --dp 1 --tp 2")
    assert.are.equal(50, #one)
    close(two, one, 1e-5)
    assert.is_true(one[50] < one[1] - 0.5, "the loss fell")
  end)

  it("gives the losses of dp = 1 with batch 2B with dp = 2 and batch B", function()
    close(losses("--steps 20 --batch 2 --dp 2 --tp 1"), losses("--steps 20 --batch 4 --dp 1 --tp 1"), 1e-5)
  end)

  it("refuses sizes that do not divide, naming them", function()
    local out, rc = gpt("--heads 4 --tp 3 --steps 1")
    assert.are_not.equal(0, rc)
    assert.matches("%-%-heads 4 is not divisible by %-%-tp 3", out)
    out, rc = gpt("--width 30 --heads 4 --steps 1")
    assert.are_not.equal(0, rc)
    assert.matches("%-%-width 30 is not divisible by %-%-heads 4", out)
  end)

  it("ends a run whose proc was killed at dp = 2, tp = 2 with the state of an uninterrupted one, bit for bit", function()
    local args = "--steps 20 --batch 2 --dp 2 --tp 2 --fused 4 --snapshot-every 4 --quiet"
    local whole, rc = gpt(args)
    assert.are.equal(0, rc, whole)
    local killed, rc2 = gpt(args .. " --kill-at 9")
    assert.are.equal(0, rc2, killed)
    assert.matches("step 10 failed", killed)
    local a, b = whole:match("state crc32 per proc: ([%x ]+)"), killed:match("state crc32 per proc: ([%x ]+)")
    assert.is_not_nil(a, whole)
    assert.are.equal(4, select(2, a:gsub("%x+", "")))
    assert.are.equal(a, b)
  end)
end)
