-- examples/gpt.lua across host agents (real monarch-run, agents, procs, collectives), on a tiny model: data
-- parallel spans the hosts (2 hosts x dp 1 gives one host's dp 2 bit for bit), a lost host shrinks the data
-- parallel ranks and a joining one grows them (each new proc takes its own tp shard; the library's end-of-run
-- check fails if a replica differs), and a controller killed mid-run is taken over by the same command, which
-- ends with the state of an uninterrupted run.
local agent = require "support.agent"
local shell = require "support.shell"

local B = os.getenv("MONARCH_BUILD") or "build"
local TOKEN = "gpt-hosts-spec-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e9))
local TINY = "--layers 2 --heads 2 --width 32 --context 16 --batch 4 --eval-windows 4 --warmup 5 --sample 0"

local function gpt(args, hosts)
  local h = hosts and (" --hosts " .. hosts) or ""
  return shell.run(("OPENBLAS_NUM_THREADS=1 MONARCH_TOKEN=%s timeout 120 %s/bin/monarch-run%s examples/gpt.lua %s %s 2>&1")
    :format(TOKEN, B, h, TINY, args))
end

local function crcs(out) return out:match("state crc32 per proc: ([%x ]+)") end

describe("examples/gpt.lua on host agents", function()
  local _, addrs = agent.per_case(3, TOKEN)

  it("runs data parallel across the hosts: 2 hosts x dp 1 give one host's dp 2, bit for bit", function()
    local one, rc1 = gpt("--dp 2 --tp 2 --steps 20 --every 0 --quiet", addrs(1))
    assert.are.equal(0, rc1, one)
    local two, rc2 = gpt("--dp 1 --tp 2 --steps 20 --every 0", addrs(2))
    assert.are.equal(0, rc2, two)
    assert.matches("mesh: 2 host%(s%) x dp 1 x tp 2 %(data parallel over 2 ranks, 8 sequences per step%)", two)
    assert.is_string(crcs(one), one)
    assert.are.equal(crcs(one), crcs(two))
  end)

  it("shrinks the data-parallel ranks on a lost host and grows them on a joined one", function()
    local out, rc = gpt("--dp 1 --tp 2 --steps 30 --every 0 --quiet --kill-host-at 15", addrs(3))
    assert.are.equal(0, rc, out)
    -- From step 16, or a later one when steps were done before the agent's death was seen.
    local from = tonumber(out:match("training goes on with 4 procs on 2 hosts from step (%d+): data parallel over 3 %-> 2 ranks"))
    assert.is_number(from, out)
    assert.is_true(from >= 16 and from <= 30, out)
    assert.matches("state crc32 per proc: %x+ %x+ %x+ %x+\n", out)
    local o = shell.scratch(finally) .. "/out"
    shell.background(("OPENBLAS_NUM_THREADS=1 MONARCH_TOKEN=%s timeout 120 %s/bin/monarch-run --hosts %s "
      .. "--listen-joins 127.0.0.1:0 examples/gpt.lua %s --dp 1 --tp 2 --steps 30 --every 0 --quiet --wait-join-at 10")
      :format(TOKEN, B, addrs(2), TINY), o)
    local join_at = shell.wait_output(o, "listening for joining hosts on ([%d.]+:%d+)", 30)
    assert.is_string(join_at, "no join port")
    assert.is_string(shell.wait_output(o, "(waiting for a host to join)", 30), "never waited at step 10")
    local joiner = agent.start { token = TOKEN, args = "--join " .. join_at }
    finally(function() joiner:stop(9) end)
    out, rc = shell.finished(o, 90)
    assert.are.equal(0, rc, out)
    assert.matches("joined with 2 procs; training goes on with 6 procs on 3 hosts from step 11: data parallel over "
      .. "2 %-> 3 ranks", out)
    -- Three replicas of the two tp shards (the end-of-run check would have named a replica that differs).
    local a, b, c, d, e, f = (crcs(out) or ""):match("(%x+) (%x+) (%x+) (%x+) (%x+) (%x+)")
    assert.is_string(a, out)
    assert.are.same({ a, b, a, b, a, b }, { a, b, c, d, e, f })
    assert.are_not.equal(a, b)
  end)

  it("survives a controller killed mid-run: the same command takes the job over, bit for bit", function()
    local dir = shell.scratch(finally)
    local args = "--dp 1 --tp 2 --steps 60 --fused 1 --every 0 --quiet --checkpoint-dir " .. dir
    local whole, rc0 = gpt(args .. " --job whole", addrs(2))
    assert.are.equal(0, rc0, whole)
    local out, rc = gpt(args .. " --die-at 30", addrs(2))
    assert.are.equal(137, rc, "--die-at 30: the controller should have been killed\n" .. out)
    out, rc = gpt(args, addrs(2))
    assert.are.equal(0, rc, out)
    assert.matches("controller: took over job 'gpt' %(4 procs on 2 hosts%) at step 3[01] from the procs' own state", out)
    assert.is_string(crcs(whole), whole)
    assert.are.equal(crcs(whole), crcs(out))
  end)
end)
