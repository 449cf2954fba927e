-- The REPL (monarch-run -i), typed at through a pseudo-terminal, against a
-- host agent run as a daemon (monarch-worker --listen), as a user would.
local core = require "monarch.core"
local pty = require "support.pty"
local agent = require "support.agent"

local B = os.getenv("MONARCH_BUILD") or "build"
local RUN = B .. "/bin/monarch-run"

local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1")
  local out = f:read("*a")
  f:close()
  return out
end

local sleep = pty.sleep

local alive = require("support.procstat").alive

describe("the REPL", function()
  local token, port, daemon, dir

  setup(function()
    token = core.generate_token()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir) == 0)
    -- Procs time out after 1 s without a controller, sessions after 1 s: persistence must beat both.
    daemon = agent.start{ token = token, env = "MONARCH_AGENT_GRACE=1", args = "--orphan-timeout 1" }
    port = daemon.port
  end)

  teardown(function()
    if daemon then daemon:stop() end
    os.execute("rm -rf " .. dir)
  end)

  -- A REPL connected to the daemon, at its first prompt.
  local function repl(...)
    local argv = { RUN, "-i", "--hosts", "127.0.0.1:" .. port, ... }
    local t = pty.spawn(argv, { MONARCH_TOKEN = token, MONARCH_TOKEN_FILE = false, HOME = dir, TERM = "xterm" })
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

  local function leave(t)
    t:ready()
    t:send("\4")
    local rc = t:wait(15)
    t:close()
    if rc ~= 0 then print("REPL output:\n" .. pty.plain(t.out)) end
    return rc
  end

  it("prints the value of an expression, a ValueMesh by coordinates", function()
    local t = repl()
    assert.matches("^%s*42%s+monarch> $", run(t, "6 * 7"))
    assert.matches("{1, 2, x = 3}", run(t, "{1, 2, x = 3}"))
    run(t, "procs = hosts:spawn_procs{procs = 2}")
    run(t, "procs:load 'basic'")
    local out = run(t, "procs:call('rank'):get()")
    assert.matches("ValueMesh{hosts=1, procs=2}", out, 1, true)
    assert.matches("[hosts=0,procs=1] {1, 2}", out, 1, true)
    assert.matches("Future%(call 'rank'%): pending", run(t, "procs:call('rank')"))
    assert.are.equal(0, leave(t))
  end)

  it("completes monarch functions, methods and globals on Tab", function()
    local t = repl()
    t:ready()
    t:send("monarch.\t")
    local listing = t:expect("attach") .. t:expect("monarch> monarch.")
    assert.matches("hosts", listing)
    assert.matches("persistent", listing)
    t:send("\21") -- Ctrl-U: clear the line
    t:ready()
    t:send("monarch.ho\t()\n")
    assert.matches("HostMesh{hosts=1}", t:expect("monarch> "), 1, true)
    run(t, "word = 'abc'")
    t:ready()
    t:send("word:up\t()\n")
    assert.matches("ABC", t:expect("monarch> "))
    t:ready()
    t:send("hel\t()\n")
    assert.matches("exit%(%) or Ctrl%-D", t:expect("monarch> "))
    assert.are.equal(0, leave(t))
  end)

  it("continues an unfinished chunk on the next lines: a multi-line function", function()
    local t = repl()
    t:ready()
    t:send("function twice(x)\n")
    t:expect("...> ")
    t:ready()
    t:send("  return 2 * x\n")
    t:expect("...> ")
    t:ready()
    t:send("end\n")
    t:expect("monarch> ")
    assert.matches("^%s*42%s", run(t, "twice(21)"))
    assert.matches("expected", run(t, "x = = 1")) -- a plain syntax error does not wait for more
    assert.are.equal(0, leave(t))
  end)

  it("stops waiting on Ctrl-C within a second; the REPL and the procs go on", function()
    local t = repl()
    run(t, "procs = hosts:spawn_procs{procs = 2}")
    run(t, "procs:load 'basic'")
    t:ready()
    t:send("procs:slice{procs = 0}:call_one('sleep', 30):get()\n")
    t:pump(0.5)
    local t0 = core.now()
    t:send("\3")
    t:expect("interrupted", 2)
    t:expect("monarch> ", 2)
    local took = core.now() - t0
    assert.is_true(took < 1, "back at the prompt after " .. took .. " s")
    assert.matches("{1, 2}", run(t, "procs:slice{procs = 1}:call_one('rank'):get()"), 1, true)
    assert.matches("2 alive", run(t, "procs"))
    assert.are.equal(0, leave(t))
  end)

  it("shows a failure that happened while the prompt waited at the next prompt", function()
    local t = repl()
    run(t, "p = hosts:spawn_procs{procs = 1}")
    local pid = tonumber(run(t, "p:procs()[1].pid"):match("(%d+)"))
    assert.is_number(pid)
    os.execute("kill -9 " .. pid)
    sleep(1.5)
    local out = run(t, "")
    assert.matches("proc_failed", out)
    assert.matches("killed by SIGKILL", out)
    assert.are.equal(0, leave(t))
  end)

  it("leaves a persistent mesh running; a second REPL attaches its procs, kernels and tensors", function()
    local one = repl()
    run(one, "work = hosts:spawn_procs{procs = 2}")
    run(one, "work:load 'basic'")
    run(one, "w = work:tensor('f32', {4})")
    run(one, "work:call('iota', w, 1):get()")
    assert.matches("ProcMesh", run(one, "work:persist('work', {w = w})"))
    local pids = run(one, "work:procs()[1].pid .. ',' .. work:procs()[2].pid"):match("(%d+,%d+)")
    assert.is_string(pids)

    -- While the first REPL holds it, nobody else can take it.
    local two = repl()
    assert.matches("held by another controller", run(two, "monarch.attach('work')"))

    one:ready()
    one:send("exit()\n")
    assert.are.equal(0, one:wait(15))
    assert.matches("leaving persistent mesh 'work' running", one:rest())
    one:close()
    sleep(2.5) -- past the procs' orphan timeout and the agent's session grace
    for pid in pids:gmatch("%d+") do assert.is_true(alive(pid), "proc " .. pid .. " died with its REPL") end

    assert.matches("work", run(two, "monarch.persistent()"))
    run(two, "m = monarch.attach('work')")
    assert.matches(pids, run(two, "m:procs()[1].pid .. ',' .. m:procs()[2].pid"), 1, true)
    local sums = run(two, "m:call('sum', m.tensors.w):get()") -- no load: the kernels are still there
    assert.matches("[hosts=0,procs=0] 10", sums, 1, true)
    assert.matches("[hosts=0,procs=1] 10", sums, 1, true)
    assert.matches("{1, 2, 3, 4}", run(two, "m.tensors.w:fetch():get()[2]:totable()"), 1, true)
    -- A new tensor does not collide with the adopted one.
    run(two, "v = m:tensor('f32', {2})")
    assert.matches("{0, 0}", run(two, "v:fetch():get()[1]:totable()"), 1, true)

    run(two, "m:detach()")
    assert.matches("stopped", run(two, "m:procs()[1].state"))
    run(two, "m = monarch.attach('work')")
    assert.matches("2 alive", run(two, "m"))
    run(two, "m:stop()")
    sleep(0.5)
    for pid in pids:gmatch("%d+") do assert.is_false(alive(pid), "proc " .. pid .. " outlived stop()") end
    assert.matches("no persistent mesh named 'work'", run(two, "monarch.attach('work')"))
    assert.are.equal(0, leave(two))
  end)

  it("refuses to persist on the agent monarch-run starts for itself", function()
    local t = pty.spawn({ RUN, "-i" }, { HOME = dir, TERM = "xterm", MONARCH_TOKEN = false, MONARCH_TOKEN_FILE = false })
    t:expect("monarch> ", 15)
    run(t, "p = hosts:spawn_procs{procs = 1}")
    assert.matches("exits with its controller", run(t, "p:persist('local')"))
    assert.are.equal(0, leave(t))
  end)

  it("runs a script first and keeps its globals and meshes", function()
    local script = dir .. "/setup.lua"
    local f = assert(io.open(script, "w"))
    f:write("local monarch = require 'monarch'\n",
      "trainers = monarch.hosts():spawn_procs{procs = 2}\n",
      "trainers:load 'basic'\n",
      "greeting = 'ready'\n")
    f:close()
    local t = repl(script)
    assert.matches("ready", run(t, "greeting"))
    assert.matches("2 alive", run(t, "trainers"))
    assert.matches("[hosts=0,procs=1] {1, 2}", run(t, "trainers:call('rank'):get()"), 1, true)
    assert.are.equal(0, leave(t))
  end)
end)
