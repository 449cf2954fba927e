-- Ctrl-C in the REPL (monarch-run -i, typed at through a pseudo-terminal)
-- stops the wait and cancels the calls it stopped waiting for (issue 19):
-- the remote sleep stops, so the next call to that proc answers at once.
local core = require "monarch.core"
local pty = require "support.pty"

local B = os.getenv("MONARCH_BUILD") or "build"
local RUN = B .. "/bin/monarch-run"

describe("Ctrl-C in the REPL", function()
  local dir

  setup(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir) == 0)
  end)

  teardown(function()
    os.execute("rm -rf " .. dir)
  end)

  -- A REPL on the host agent it starts for itself, at its first prompt; closed when the spec ends.
  local function repl()
    local t = pty.spawn({ RUN, "-i" }, { HOME = dir, TERM = "xterm", MONARCH_TOKEN = false, MONARCH_TOKEN_FILE = false })
    finally(function() t:close() end)
    t:expect("monarch> ", 15)
    return t
  end

  -- Types a line at the prompt; returns what came back before the next prompt.
  local function run(t, line, timeout)
    t:ready()
    t:send(line .. "\n")
    local out = t:expect("monarch> ", timeout)
    return out:sub(#line + 1)
  end

  -- Types line (a wait), presses Ctrl-C half a second later, and waits for the prompt.
  local function interrupt(t, line)
    t:ready()
    t:send(line .. "\n")
    t:pump(0.5)
    t:send("\3")
    t:expect("interrupted", 2)
    t:expect("monarch> ", 2)
  end

  local function leave(t)
    t:ready()
    t:send("\4")
    local rc = t:wait(15)
    t:close()
    if rc ~= 0 then print("REPL output:\n" .. pty.plain(t.out)) end
    return rc
  end

  it("cancels the call it stopped waiting for: the proc's sleep stops and the next call answers at once", function()
    local t = repl()
    run(t, "p = hosts:spawn_procs{procs = 1}")
    run(t, "p:load 'basic'")
    local pid = run(t, "p:procs()[1].pid"):match("(%d+)")
    assert.is_string(pid)
    run(t, "slow = p:call_one('sleep', 30)")
    interrupt(t, "slow:get()")
    local t0 = core.now()
    -- Without the cancel this waits 29.5 s behind the sleep.
    local out = run(t, "p:call_one('echo', 7):get()", 3)
    local took = core.now() - t0
    assert.matches("^%s*7%s", out)
    assert.is_true(took < 2, "the next call answered after " .. took .. " s")
    assert.matches("cancelled", run(t, "print((select(2, slow:result())).kind)"))
    assert.matches(pid, run(t, "p:procs()[1].pid"), 1, true) -- stopped by the cancel, not by a kill
    assert.are.equal(0, leave(t))
  end)

  it("cancels every proc's part of a ValueMesh call", function()
    local t = repl()
    run(t, "procs = hosts:spawn_procs{procs = 2}")
    run(t, "procs:load 'basic'")
    interrupt(t, "procs:call('sleep', 30):get()")
    local t0 = core.now()
    local out = run(t, "procs:call('echo', 7):get()", 3)
    local took = core.now() - t0
    assert.matches("[hosts=0,procs=0] 7", out, 1, true)
    assert.matches("[hosts=0,procs=1] 7", out, 1, true)
    assert.is_true(took < 2, "the next call answered after " .. took .. " s")
    assert.are.equal(0, leave(t))
  end)
end)
