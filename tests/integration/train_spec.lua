-- examples/train.lua as a user runs it (real monarch-run processes, each
-- with its own procs), and the checkpoint files it writes.
local checkpoint = require "monarch.checkpoint"

local B = os.getenv("MONARCH_BUILD") or "build"
-- On the CPU whatever the host has: the GPU run (one proc per GPU) is in gpu_spec.lua.
local RUN = "timeout 120 " .. B .. "/bin/monarch-run examples/train.lua --device cpu"
local TMP = os.getenv("TMPDIR") or "/tmp"

local shell = require "support.shell"
local sh = shell.run

local exists = shell.exists

local read = shell.read

local write = shell.write

local scratch = {}
-- Named after a file os.tmpname made for this run alone: suites of other
-- checkouts may run at the same second with the same TMP.
local unique = os.tmpname()
scratch[1] = unique
local function tmpdir()
  local d = string.format("%s/train_spec.%s.%d", TMP, unique:match("[^/]+$"), #scratch + 1)
  local ok = os.execute("rm -rf '" .. d .. "' && mkdir -p '" .. d .. "'")
  assert(ok == 0 or ok == true, "cannot create " .. d)
  scratch[#scratch + 1] = d
  return d
end

-- The real data set when it is here or can be fetched, else a synthetic one.
local data_arg = ""
local function ensure_data()
  data_arg = require("support.digits").data_arg(tmpdir())
end

-- Runs train.lua with args; returns its output and exit code.
local function train(args)
  return sh(RUN .. data_arg .. " " .. args)
end

local function crc_of(out)
  return out:match("weights identical on all %d+ procs %(%d+ parameters, crc32 (%x+)%)")
end

-- {step, loss, acc} of every progress line.
local function progress_lines(out)
  local t = {}
  for step, loss, acc in out:gmatch("step (%d+)/%d+%s+epoch %d+/%d+%s+loss ([%d.]+)%s+acc%s+([%d.]+)%%") do
    t[#t + 1] = { step = tonumber(step), loss = tonumber(loss), acc = tonumber(acc) }
  end
  return t
end

describe("examples/train.lua", function()
  setup(ensure_data)
  teardown(function()
    for _, d in ipairs(scratch) do os.execute("rm -rf '" .. d .. "'") end
  end)

  it("lowers the loss and raises the accuracy in a short run", function()
    local dir = tmpdir()
    local out, rc = train("--steps 40 --log-every 1 --every 0 --checkpoint-dir " .. dir)
    assert.are.equal(0, rc, out)
    local p = progress_lines(out)
    assert.are.equal(40, #p, out)
    local first, last = p[1], p[#p]
    assert.is_true(last.loss < first.loss / 2, out)
    assert.is_true(last.acc > first.acc + 30, out)
    local test_acc = tonumber(out:match("test accuracy ([%d.]+)%%"))
    assert.is_true(test_acc > 80, out)
    assert.matches("done: 40 steps", out)
  end)

  it("gives bitwise the step-by-step weights with --fused K (K steps per call, in-kernel all_reduce)", function()
    local steps, rc1 = train("--steps 25 --procs 4 --every 0 --quiet --checkpoint-dir " .. tmpdir())
    assert.are.equal(0, rc1, steps)
    local fused, rc2 = train("--steps 25 --procs 4 --every 0 --quiet --fused 7 --checkpoint-dir " .. tmpdir())
    assert.are.equal(0, rc2, fused)
    assert.is_not_nil(crc_of(steps), steps)
    assert.are.equal(crc_of(steps), crc_of(fused), fused)
    assert.matches("done: 25 steps", fused)
  end)

  it("keeps the weights identical on every proc and says so", function()
    local out, rc = train("--steps 12 --procs 3 --every 0 --quiet --checkpoint-dir " .. tmpdir())
    assert.are.equal(0, rc, out)
    assert.is_not_nil(crc_of(out), out)
    assert.matches("weights identical on all 3 procs", out)
  end)

  it("ends a resumed run with the same weights as an uninterrupted one, bit for bit", function()
    local a, b = tmpdir(), tmpdir()
    local whole, rc1 = train("--steps 30 --every 10 --quiet --checkpoint-dir " .. a)
    assert.are.equal(0, rc1, whole)
    local part, rc2 = train("--steps 20 --every 10 --quiet --checkpoint-dir " .. b)
    assert.are.equal(0, rc2, part)
    local rest, rc3 = train("--steps 30 --every 10 --quiet --resume --checkpoint-dir " .. b)
    assert.are.equal(0, rc3, rest)
    assert.matches("resumed from .*ckpt%-000000020%.bin %(step 20%)", rest)
    assert.matches("done: 10 steps", rest)
    local ca = assert(checkpoint.read(a .. "/ckpt-000000030.bin"))
    local cb = assert(checkpoint.read(b .. "/ckpt-000000030.bin"))
    assert.is_true(ca.by_name.params == cb.by_name.params, "parameters differ")
    assert.is_true(ca.by_name.adam == cb.by_name.adam, "Adam states differ")
    assert.are.equal(crc_of(whole), crc_of(rest))
    assert.are_not.equal(crc_of(whole), crc_of(part))
  end)

  it("recovers from a failed step by replaying from its last snapshot, bit for bit", function()
    local whole = train("--steps 30 --every 0 --quiet --checkpoint-dir " .. tmpdir())
    local out, rc = train("--steps 30 --every 0 --quiet --snapshot-every 10 --fail-at 17 --checkpoint-dir " .. tmpdir())
    assert.are.equal(0, rc, out)
    assert.matches("restored the weights of step 10; replaying 7 step%(s%)", out)
    assert.matches("recovered from 1 failed step", out)
    assert.are.equal(crc_of(whole), crc_of(out))
  end)

  it("recovers from a killed proc and ends with the same weights as a run without the kill, bit for bit", function()
    if not require("monarch.mesh").ProcMesh.ready then
      pending("needs proc restarts (ProcMesh:ready)")
      return
    end
    local a, b = tmpdir(), tmpdir()
    local whole, rc1 = train("--steps 30 --every 30 --quiet --checkpoint-dir " .. a)
    assert.are.equal(0, rc1, whole)
    local out, rc = train("--steps 30 --every 30 --quiet --snapshot-every 10 --kill-at 17 --checkpoint-dir " .. b)
    assert.are.equal(0, rc, out)
    assert.matches("step 18 failed: monarch: ", out)
    assert.matches("restored the weights of step 10; replaying 7 step%(s%)", out)
    local ca = assert(checkpoint.read(a .. "/ckpt-000000030.bin"))
    local cb = assert(checkpoint.read(b .. "/ckpt-000000030.bin"))
    assert.is_true(ca.by_name.params == cb.by_name.params, "parameters differ")
    assert.is_true(ca.by_name.adam == cb.by_name.adam, "Adam states differ")
    assert.are.equal(crc_of(whole), crc_of(out))
  end)

  it("refuses a corrupt checkpoint with a clear message, and --resume falls back to an older one", function()
    local dir = tmpdir()
    local out, rc = train("--steps 20 --every 10 --quiet --checkpoint-dir " .. dir)
    assert.are.equal(0, rc, out)
    local newest = dir .. "/ckpt-000000020.bin"
    local s = read(newest)
    local at = 1000 -- a byte inside the parameters (the header is a few hundred bytes)
    write(newest, s:sub(1, at - 1) .. string.char((s:byte(at) + 1) % 256) .. s:sub(at + 1))

    out, rc = train("--steps 30 --quiet --resume-from " .. newest .. " --checkpoint-dir " .. dir)
    assert.are.equal(1, rc, out)
    assert.matches("cannot resume: " .. newest:gsub("%p", "%%%0") .. ": checksum mismatch %(stored %x+, computed %x+%): the file is corrupt", out)

    out, rc = train("--steps 30 --every 0 --quiet --resume --checkpoint-dir " .. dir)
    assert.are.equal(0, rc, out)
    assert.matches("resume: skipping .*ckpt%-000000020%.bin: checksum mismatch", out)
    assert.matches("resumed from .*ckpt%-000000010%.bin %(step 10%)", out)

    write(dir .. "/ckpt-000000010.bin", s:sub(1, 50))
    out, rc = train("--steps 30 --quiet --resume --checkpoint-dir " .. dir)
    assert.are.equal(1, rc, out)
    assert.matches("cannot resume: no valid checkpoint in", out)
  end)

  it("rejects bad options with a message that names them", function()
    local out, rc = train("--batch 0")
    assert.are.equal(1, rc)
    assert.matches("%-%-batch must be at least 1", out)
    out, rc = train("--frobnicate")
    assert.are.equal(1, rc)
    assert.matches("unknown argument '%-%-frobnicate'", out)
    out, rc = train("--lr fast")
    assert.are.equal(1, rc)
    assert.matches("%-%-lr wants a number, got 'fast'", out)
    out, rc = train("--help")
    assert.are.equal(0, rc)
    assert.matches("%-%-checkpoint%-dir", out)
  end)
end)

describe("monarch.checkpoint", function()
  local dir
  before_each(function() dir = tmpdir() end)

  local function record(step)
    return { step = step, meta = { hidden = 8, lr = 0.5 },
      sections = { { name = "params", bytes = string.rep("\1\2\3\0", 10 + step) }, { name = "empty", bytes = "" } } }
  end

  it("round-trips a record", function()
    local ck = assert(checkpoint.decode(checkpoint.encode(record(7))))
    assert.are.equal(7, ck.step)
    assert.are.same({ hidden = "8", lr = "0.5" }, ck.meta)
    assert.are.equal(string.rep("\1\2\3\0", 17), ck.by_name.params)
    assert.are.equal("", ck.by_name.empty)
  end)

  it("computes zlib's CRC-32", function()
    assert.are.equal(0xCBF43926, checkpoint.crc32("123456789"))
    assert.are.equal(0, checkpoint.crc32(""))
  end)

  it("writes atomically, keeps the newest few and finds the newest", function()
    for step = 1, 5 do checkpoint.write(dir .. "/sub", record(step), { keep = 2 }) end
    local all = checkpoint.list(dir .. "/sub")
    assert.are.same({ 4, 5 }, { all[1].step, all[2].step })
    local ok = os.execute("ls -A '" .. dir .. "/sub' | grep -q tmp")
    assert.are_not.equal(0, ok) -- no temp file left behind
    local ck, path = checkpoint.latest(dir .. "/sub")
    assert.are.equal(5, ck.step)
    assert.matches("ckpt%-000000005%.bin$", path)
  end)

  it("names what is wrong with a damaged file", function()
    local good = checkpoint.encode(record(3))
    local function why(s) return select(2, checkpoint.decode(s, "f.bin")) end
    assert.are.equal("f.bin: not a monarch checkpoint (bad magic)", why("hello" .. good))
    assert.matches("^f%.bin: checkpoint version 2 is not supported", why(good:sub(1, 8) .. "\2" .. good:sub(10)))
    assert.matches("^f%.bin: size is %d+ bytes but the header describes", why(good:sub(1, -2)))
    assert.matches("^f%.bin: checksum mismatch", why(good:sub(1, -2) .. "x"))
    assert.matches("^f%.bin: truncated", why(good:sub(1, 20)))
  end)

  it("reports an empty directory", function()
    local ck, msg = checkpoint.latest(dir .. "/none")
    assert.is_nil(ck)
    assert.matches("no checkpoint %(ckpt%-%*%.bin%) in", msg)
  end)
end)
