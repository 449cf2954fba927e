-- monarch-run as a user meets it: a real process, its output and exit code.
local B = os.getenv("MONARCH_BUILD") or "build"
local RUN = B .. "/bin/monarch-run"

local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1; echo \"::rc=$?\"")
  local out = f:read("*a")
  f:close()
  local rc = tonumber(out:match("::rc=(%d+)%s*$"))
  return out:gsub("::rc=%d+%s*$", ""), rc
end

local alive = require("support.procstat").alive

describe("monarch-run", function()
  it("prints usage with --help and exits 0", function()
    local out, rc = sh(RUN .. " --help")
    assert.are.equal(0, rc)
    assert.matches("usage: monarch%-run", out)
    assert.matches("%-%-hosts", out)
  end)

  it("prints its version", function()
    local out, rc = sh(RUN .. " --version")
    assert.are.equal(0, rc)
    assert.matches("monarch%-run %d+%.%d+", out)
  end)

  it("runs -e code", function()
    local out, rc = sh(RUN .. " -e 'print(1 + 1)'")
    assert.are.equal(0, rc)
    assert.are.equal("2\n", out)
  end)

  it("passes script arguments in arg and as varargs", function()
    local f = os.tmpname()
    local h = io.open(f, "w")
    h:write("print(arg[0] ~= nil, arg[1], arg[2], select('#', ...), ...)\n")
    h:close()
    local out, rc = sh(RUN .. " " .. f .. " a b")
    os.remove(f)
    assert.are.equal(0, rc)
    assert.are.equal("true\ta\tb\t2\ta\tb\n", out)
  end)

  it("rejects an unknown option with a message", function()
    local out, rc = sh(RUN .. " --bogus")
    assert.are.equal(2, rc)
    assert.matches("unknown option '%-%-bogus'", out)
  end)

  it("reports a missing script file", function()
    local out, rc = sh(RUN .. " /nonexistent/x.lua")
    assert.are.equal(1, rc)
    assert.matches("cannot open /nonexistent/x.lua", out)
  end)

  it("runs examples/hello.lua", function()
    local out, rc = sh(RUN .. " examples/hello.lua")
    assert.are.equal(0, rc)
    assert.matches("ProcMesh{hosts=1, procs=4}", out)
    assert.matches("proc 3: sum = 1024", out)
    assert.matches("echo from procs=2:%s+hello", out)
  end)

  -- The controller's first heartbeat tick must see its own stall: a script that computes before it first
  -- waits lost its local agent ("no heartbeat for 4.0 s") when the tick had no earlier one to compare with.
  it("keeps its local agent when the script blocks right after starting, before it first waits", function()
    local code = [[
      local m = require 'monarch'
      local h = m.hosts()
      os.execute('sleep 4.5')
      local p = h:spawn_procs{ procs = 1 }
      p:load 'basic'
      print('echo ' .. p:call_one('echo', 5):get())
    ]]
    local out, rc = sh(RUN .. " -e \"" .. code .. "\"")
    assert.are.equal(0, rc, out)
    assert.matches("echo 5", out)
  end)

  it("exits non-zero on a script error and leaves no process behind", function()
    local code = [[
      local m = require 'monarch'
      local p = m.hosts():spawn_procs{ procs = 3 }
      local pids = {}
      for _, x in ipairs(p:procs()) do pids[#pids + 1] = x.pid end
      print('pids ' .. m.hosts().agents[1].pid .. ' ' .. table.concat(pids, ' '))
      io.stdout:flush()
      error('deliberate failure')
    ]]
    local out, rc = sh(RUN .. " -e \"" .. code .. "\"")
    assert.are.equal(1, rc)
    assert.matches("deliberate failure", out)
    assert.matches("stack traceback", out)
    local pids = out:match("pids ([%d ]+)")
    assert.is_string(pids)
    local n = 0
    for pid in pids:gmatch("%d+") do
      n = n + 1
      assert.is_false(alive(pid), "process " .. pid .. " outlived monarch-run")
    end
    assert.are.equal(4, n)
  end)

  it("names the proc and kernel when a remote call fails", function()
    local out, rc = sh(RUN .. [[ -e "local m = require 'monarch'; local p = m.hosts():spawn_procs{procs = 1}; p:load 'basic'; p:call_one('fill', 1, 2):get()"]])
    assert.are.equal(1, rc)
    assert.matches("bad_args in 'fill' on rank 0", out)
    assert.matches("argument 1: expected tensor, got integer", out)
  end)

  it("sends a broadcast issued just before the script ends", function()
    local out, rc = sh(RUN .. [[ -e "local m = require 'monarch'; local p = m.hosts():spawn_procs{procs = 2}; p:load 'faulty'; p:broadcast('print', 'last words')"]])
    assert.are.equal(0, rc)
    assert.matches("%[[^%]]+ r0%-1%] last words", out) -- both ranks printed it
  end)

  it("fails clearly when --hosts has no token", function()
    local out, rc = sh("env -u MONARCH_TOKEN -u MONARCH_TOKEN_FILE " .. RUN .. " --hosts 127.0.0.1:1 -e \"require('monarch').hosts()\"")
    assert.are.equal(1, rc)
    assert.matches("needs the cluster token", out)
  end)

  it("fails clearly when a host agent cannot be reached", function()
    local out, rc = sh("MONARCH_TOKEN=t " .. RUN .. " --hosts 127.0.0.1:1 -e \"require('monarch').hosts()\"")
    assert.are.equal(1, rc)
    assert.matches("cannot reach host agent", out)
    assert.matches("127.0.0.1:1", out)
  end)
end)

describe("proc output", function()
  local B = os.getenv("MONARCH_BUILD") or "build"
  local RUN = B .. "/bin/monarch-run"
  local function sh(cmd)
    local f = io.popen(cmd .. " 2>&1")
    local out = f:read("*a")
    f:close()
    return out
  end

  it("reaches the controller prefixed with host and rank, identical lines collapsed", function()
    local out = sh(RUN .. [[ -e "local m = require 'monarch'; local p = m.hosts():spawn_procs{procs = 4}; p:load 'faulty'; p:call('print', 'same everywhere'):get(); p:slice{procs = 2}:call_one('eprint', 'only two'):get()"]])
    assert.matches("%[[^%]]+ r0%-3%] same everywhere", out)
    local _, n = out:gsub("same everywhere", "")
    assert.are.equal(1, n)
    assert.matches("%[[^%]]+ r2%] only two", out)
  end)

  it("is dropped with log.quiet, stderr kept", function()
    local out = sh(RUN .. [[ -e "local m = require 'monarch'; m.log.quiet = true; local p = m.hosts():spawn_procs{procs = 2}; p:load 'faulty'; p:call('print', 'chatter'):get(); p:call('eprint', 'problem'):get()"]])
    assert.is_nil(out:find("chatter", 1, true))
    assert.matches("problem", out)
  end)
end)

describe("monarch-run --status", function()
  local B = os.getenv("MONARCH_BUILD") or "build"
  it("lists a daemon agent's procs with what they run, and recent exits", function()
    local daemon = require("support.agent").start{ token = "st" }
    local port = daemon.port
    local run = ("MONARCH_TOKEN=st %s/bin/monarch-run --hosts 127.0.0.1:%d "):format(B, port)
    local f = io.popen(run .. [[-e "local m = require 'monarch'; local p = m.hosts():spawn_procs{procs = 2}; ]] ..
      [[p:load 'basic'; p:load 'faulty'; pcall(function() p:slice{procs = 1}:call_one('exit', 3):get() end); ]] ..
      [[local s = p:slice{procs = 0}; local g = s:call_one('sleep', 2.5); m.sleep(1.6); m.status()" 2>&1]])
    local out = f:read("*a")
    f:close()
    local f2 = io.popen(run .. "--status 2>&1")
    local after = f2:read("*a")
    f2:close()
    daemon:stop()
    assert.matches("host %S+ %(127%.0%.0%.1:" .. port .. "%)", out)
    assert.matches("%s0%s+%d+ attached%s+%S+%s+%d+%s+%d+%s+sleep", out) -- rank 0 is running sleep
    assert.matches("rank 1 pid %d+ exited with code 3", out)
    assert.matches("rank 1 pid %d+ exited with code 3", after) -- a later controller sees the history
  end)
end)
