-- The curves of examples/train.lua and examples/rl/run.lua (--csv, --plot),
-- from real runs: the CSV's values, the SVG's series, and the picture that
-- headless Chromium renders from the SVG (decoded by tests/support/png_curve.py,
-- which needs Python's Pillow: Debian's python3-pil).
local B = os.getenv("MONARCH_BUILD") or "build"
local TMP = os.getenv("TMPDIR") or "/tmp"
local TRAIN = "timeout 120 " .. B .. "/bin/monarch-run examples/train.lua --device cpu --procs 2 --every 0 --quiet"
local RL = "timeout 120 " .. B .. "/bin/monarch-run examples/rl/run.lua --procs 2"
local STEPS = 30
local LOSS, ACCURACY = "1f6fb4", "e8710a"    -- monarch.plot's first two colours (train.lua's series)
local RETURN, MEAN100 = "9cc3e6", "e8710a"   -- rl/run.lua's colours

local shell = require "support.shell"
local sh = shell.run

local read = shell.read

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function which(name)
  local out, rc = sh("command -v " .. name)
  return rc == 0 and out:match("^(%S+)") or nil
end

-- Headless Chromium, Debian's package or the upstream name.
local chromium = which("chromium") or which("chromium-browser")
-- Debian's python3 first (python3-pil is for it), then whatever python3 is on PATH.
local python = io.open("/usr/bin/python3", "rb") and "/usr/bin/python3" or "python3"

-- A scratch directory of this run alone (os.tmpname made the name).
local scratch = os.tmpname()
os.remove(scratch)
assert(os.execute("mkdir -p " .. q(scratch)) == 0)

-- The CSV as rows of numbers under its header.
local function parse_csv(text)
  local lines = {}
  for l in text:gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  local rows = {}
  for i = 2, #lines do
    local r = {}
    for v in lines[i]:gmatch("[^,]+") do r[#r + 1] = tonumber(v) end
    rows[#rows + 1] = r
  end
  return lines[1], rows
end

-- {name = number of points} of the SVG's polylines, and its frame {x0, y0, x1, y1}.
local function svg_parts(svg)
  local series = {}
  for name, pts in svg:gmatch('<polyline class="series" data%-name="([^"]*)".- points="([^"]*)"') do
    local n = 0
    for _ in pts:gmatch("[%d.]+,[%d.]+") do n = n + 1 end
    series[name] = n
  end
  local x, y, w, h = svg:match('<rect class="frame" x="([%d.]+)" y="([%d.]+)" width="([%d.]+)" height="([%d.]+)"')
  local size_w, size_h = svg:match('<svg [^>]*width="(%d+)" height="(%d+)"')
  return series, { tonumber(x), tonumber(y), tonumber(x) + tonumber(w), tonumber(y) + tonumber(h) },
    tonumber(size_w), tonumber(size_h)
end

--[[ Renders svg_path in headless Chromium at the SVG's size and reads the
  picture back: returns { size = {w, h}, nonwhite = n, [colour] = { pixels,
  bands, first, last } } (see tests/support/png_curve.py). ]]
local function render(svg_path, colours)
  local _, box, w, h = svg_parts(read(svg_path))
  local png = svg_path:gsub("%.svg$", "") .. ".png"
  local profile = scratch .. "/chromium-profile"
  local out, rc = sh(string.format("HOME=%s timeout 60 %s --headless --disable-gpu --no-sandbox --hide-scrollbars " ..
    "--user-data-dir=%s --screenshot=%s --window-size=%d,%d file://%s", q(scratch), chromium, q(profile), q(png), w, h,
    q(svg_path)))
  assert.are.equal(0, rc, "chromium failed:\n" .. out)
  out, rc = sh(string.format("%s tests/support/png_curve.py %s %.0f %.0f %.0f %.0f %s", python, q(png), box[1], box[2],
    box[3], box[4], table.concat(colours, " ")))
  assert.are.equal(0, rc, "tests/support/png_curve.py failed (it needs python3-pil):\n" .. out)
  local pic = {}
  local pw, ph = out:match("size (%d+) (%d+)")
  pic.size = { tonumber(pw), tonumber(ph) }
  pic.nonwhite = tonumber(out:match("nonwhite (%d+)"))
  for _, c in ipairs(colours) do
    local n, b, first, last = out:match(c .. " pixels (%d+) bands (%d+) first ([%d.%-]+) last ([%d.%-]+)")
    pic[c] = { pixels = tonumber(n), bands = tonumber(b), first = tonumber(first), last = tonumber(last) }
  end
  return pic, w, h
end

local function need_chromium()
  if not chromium then pending("chromium is not installed (apt-get install chromium python3-pil)") end
  return chromium ~= nil
end

-- One training run with --csv and --plot, shared by the specs that read it.
local data_arg
local runs = {}
local function train(name, args)
  if not runs[name] then
    data_arg = data_arg or require("support.digits").data_arg(scratch)
    local base = scratch .. "/" .. name
    local out, rc = sh(string.format("%s%s --steps %d --csv %s --plot %s %s", TRAIN, data_arg, STEPS,
      q(base .. ".csv"), q(base .. ".svg"), args or ""))
    runs[name] = { out = out, rc = rc, csv = base .. ".csv", svg = base .. ".svg" }
  end
  return runs[name]
end

describe("the curves of the examples", function()
teardown(function() os.execute("rm -rf " .. q(scratch)) end)

describe("examples/train.lua --csv FILE --plot FILE", function()
  it("writes the loss and the accuracy of every step as CSV", function()
    local r = train("steps")
    assert.are.equal(0, r.rc, r.out)
    assert.matches("csv: " .. r.csv .. " (" .. STEPS .. " steps)", r.out, 1, true)
    local header, rows = parse_csv(read(r.csv))
    assert.are.equal("step,epoch,loss,accuracy", header)
    assert.are.equal(STEPS, #rows)
    local first, last = 0, 0
    for i, row in ipairs(rows) do
      assert.are.equal(4, #row, "row " .. i)
      assert.are.equal(i, row[1])
      assert.is_true(row[2] == 1 or row[2] == 2, "epoch of step " .. i)
      assert.is_true(row[3] > 0 and row[3] < 10, "loss of step " .. i)
      assert.is_true(row[4] >= 0 and row[4] <= 1, "accuracy of step " .. i)
      if i <= 5 then first = first + row[3] end
      if i > STEPS - 5 then last = last + row[3] end
    end
    assert.is_true(last < first / 2, "the loss should fall: first 5 steps " .. first .. ", last 5 " .. last)
  end)

  it("writes both curves as an SVG line plot, a point per step", function()
    local r = train("steps")
    assert.are.equal(0, r.rc, r.out)
    assert.matches("plot: " .. r.svg .. " (" .. STEPS .. " steps)", r.out, 1, true)
    local series = svg_parts(read(r.svg))
    assert.are.same({ loss = STEPS, accuracy = STEPS }, series)
  end)

  it("draws the curves: Chromium renders both across the plot, the loss falling and the accuracy rising", function()
    if not need_chromium() then return end
    local r = train("steps")
    assert.are.equal(0, r.rc, r.out)
    local pic, w, h = render(r.svg, { LOSS, ACCURACY })
    assert.are.same({ w, h }, pic.size)
    assert.is_true(pic.nonwhite > w * h / 50, "the picture is (nearly) blank: " .. pic.nonwhite .. " pixels drawn")
    for name, c in pairs { loss = pic[LOSS], accuracy = pic[ACCURACY] } do
      assert.is_true(c.pixels > 100, name .. ": only " .. c.pixels .. " pixels of its colour")
      assert.are.equal(10, c.bands, name .. " should cross all 10 column bands of the plot")
    end
    -- Rows grow downwards: the loss ends lower in the picture than it starts, the accuracy higher.
    local loss, acc = pic[LOSS], pic[ACCURACY]
    assert.is_true(loss.first < loss.last, string.format("loss: mean row %g in the first band, %g in the last", loss.first,
      loss.last))
    assert.is_true(acc.first > acc.last, string.format("accuracy: mean row %g in the first band, %g in the last", acc.first,
      acc.last))
  end)

  it("writes the same curves with --fused K (K steps per call)", function()
    local steps, fused = train("steps"), train("fused", "--fused 4")
    assert.are.equal(0, fused.rc, fused.out)
    assert.are.equal(read(steps.csv), read(fused.csv))
    assert.are.equal(read(steps.svg), read(fused.svg))
  end)

  it("refuses an output file that cannot be written, naming it, before it trains", function()
    local bad = scratch .. "/no/such/dir/curves.svg"
    local out, rc = sh(TRAIN .. " --steps 5 --plot " .. q(bad))
    assert.are_not.equal(0, rc)
    assert.matches("train.lua: --plot: cannot write " .. bad .. ": No such file or directory", out, 1, true)
    assert.is_nil(out:find("training on", 1, true), out)
    out, rc = sh(RL .. " --csv " .. q(bad))
    assert.are_not.equal(0, rc)
    assert.matches("--csv: cannot write " .. bad .. ": No such file or directory", out, 1, true)
    assert.is_nil(out:find("CartPole-v0:", 1, true), out)
  end)
end)

describe("examples/rl/run.lua --csv FILE --plot FILE", function()
  local rl
  local function run()
    if not rl then
      local base = scratch .. "/rl"
      local out, rc = sh(string.format("%s --csv %s --plot %s", RL, q(base .. ".csv"), q(base .. ".svg")))
      rl = { out = out, rc = rc, csv = base .. ".csv", svg = base .. ".svg" }
    end
    return rl
  end

  it("writes the return of every episode and the mean of the last 100", function()
    local r = run()
    assert.are.equal(0, r.rc, r.out)
    local header, rows = parse_csv(read(r.csv))
    assert.are.equal("episode,return,mean100,rank,version,seconds", header)
    assert.matches("csv: " .. r.csv .. " (" .. #rows .. " episodes)", r.out, 1, true)
    assert.is_true(#rows >= 100, #rows .. " episodes")
    local sum, best = 0, 0
    for i, row in ipairs(rows) do
      assert.are.equal(i, row[1])
      assert.is_true(row[2] >= 1 and row[2] <= 200, "return of episode " .. i)
      sum = sum + row[2] - (i > 100 and rows[i - 100][2] or 0)
      assert.is_true(math.abs(row[3] - sum / math.min(i, 100)) < 1e-6, "mean100 of episode " .. i)
      assert.is_true(row[4] == 0 or row[4] == 1, "rank of episode " .. i)
      best = math.max(best, row[3])
    end
    assert.is_true(best >= 195, "solved, yet the best mean100 is " .. best)
    local series = svg_parts(read(r.svg))
    assert.are.same({ ["return"] = #rows, ["mean of the last 100"] = #rows }, series)
  end)

  it("draws them: Chromium renders the returns across the plot and their mean rising", function()
    if not need_chromium() then return end
    local r = run()
    assert.are.equal(0, r.rc, r.out)
    local pic = render(r.svg, { RETURN, MEAN100 })
    assert.are.equal(10, pic[RETURN].bands)
    assert.are.equal(10, pic[MEAN100].bands)
    local m = pic[MEAN100]
    assert.is_true(m.first > m.last, string.format("mean100: mean row %g in the first band, %g in the last", m.first, m.last))
  end)
end)
end)
