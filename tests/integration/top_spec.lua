-- `monarch-run --top` and top() in the REPL (issue 18): the live view of real
-- host agents and procs, run in tmux (a real terminal emulator) and read
-- back from its screen (capture-pane), as a user would see it. This spec is
-- the job's controller: it spawns the procs, keeps one busy with calls and
-- one in a long kernel, kills one, and stops a host agent.
local monarch = require "monarch"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local agent = require "support.agent"
local pty = require "support.pty"

local B = os.getenv("MONARCH_BUILD") or "build"
local RUN = B .. "/bin/monarch-run"
local FAKE_NVML = B .. "/tests/libmonarch_fakenvml.so"
local DEADLINE = 15      -- seconds to wait for what the screen should show (it refreshes every second)
local GPU_BYTES = 3 * 2 ^ 30 -- what the fake NVML says rank 2 holds: "3.0G"

local function shq(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1")
  local out = f:read("*a")
  f:close()
  return out
end

describe("monarch-run --top", function()
  local token, a1, a2, dir, sock, job, busy, sleeper, nvml_file

  -- tmux on a socket of this spec's own, so no other tmux is touched.
  local function tmux(args) return sh("tmux -S " .. shq(sock) .. " " .. args) end

  -- Runs cmd in a new tmux session `name` on a rows x cols terminal; after cmd
  -- the shell says how it exited and shows the terminal's modes (stty -a).
  local function start(name, cmd, rows, cols)
    -- "stty done" last: a screen that shows it shows the whole of stty's report too.
    local script = string.format("%s; echo \"top exited with $?\"; stty -a; echo \"stty done\"; sleep 60", cmd)
    local out = tmux(string.format("new-session -d -s %s -x %d -y %d %s", name, cols or 160, rows or 40,
      shq("env MONARCH_TOKEN=" .. token .. " MONARCH_HISTORY= sh -c " .. shq(script))))
    assert(out == "", "tmux new-session: " .. out)
  end

  local function screen(name) return tmux("capture-pane -p -t " .. name) end

  -- Waits (pumping this job's controller) until pred(screen) is true; returns the screen.
  local function wait_screen(name, pred, what)
    local t0 = monarch.now()
    local s
    repeat
      s = screen(name)
      if pred(s) then return s end
      pty.sleep(0.1)
    until monarch.now() - t0 > DEADLINE
    error(string.format("the screen never showed %s within %ds; it shows:\n%s", what, DEADLINE, s), 2)
  end

  local function has(text) return function(s) return s:find(text, 1, true) ~= nil end end

  -- The fields of the proc row of `rank` (RANK PID STATE CALLS/S QUEUE RUNNING FOR CPU% RSS GPU UPTIME HELD).
  local function row(s, rank)
    for line in s:gmatch("[^\n]+") do
      local t = {}
      for w in line:gmatch("%S+") do t[#t + 1] = w end
      if #t == 12 and t[1] == tostring(rank) and tonumber(t[2]) then
        return { pid = tonumber(t[2]), state = t[3], calls = tonumber(t[4]), queue = tonumber(t[5]), running = t[6],
          ["for"] = t[7], cpu = tonumber(t[8]), rss = t[9], gpu = t[10], uptime = t[11], held = t[12] }
      end
    end
  end

  local function pid_of(rank)
    for _, p in ipairs(job:procs()) do if p.rank == rank then return p.pid end end
  end

  setup(function()
    assert(sh("command -v tmux") ~= "", "this spec needs tmux (apt-get install tmux)")
    monarch.hosts() -- this process's controller (the job's)
    token = runtime.token
    dir = sh("mktemp -d"):gsub("%s+$", "")
    sock, nvml_file = dir .. "/tmux.sock", dir .. "/nvml"
    a1 = agent.start{ token = token }
    a2 = agent.start{ token = token, env = "MONARCH_NVML=" .. FAKE_NVML .. " MONARCH_FAKE_NVML=" .. nvml_file }
    -- Ranks 0 and 1 on the first host, 2 and 3 on the second.
    job = mesh_mod.host_mesh(mesh_mod.connect_agents{ a1.addr, a2.addr }):spawn_procs{ procs = 2 }
    job:load "basic"
    job:on_failure(function() end) -- the procs this spec kills
    local f = io.open(nvml_file, "w")
    f:write(string.format("%d %d\n", pid_of(2), GPU_BYTES))
    f:close()
    busy = true
    local r0 = job:slice{ hosts = 0, procs = 0 }
    runtime.spawn(function()
      while busy and pcall(function() r0:call_one("noop"):await() end) do end
    end)
    sleeper = job:slice{ hosts = 0, procs = 1 }:call_one("sleep", 120) -- ends with stop() in teardown
  end)

  teardown(function()
    busy = false
    if sock then tmux("kill-server") end
    if job then pcall(job.stop, job) end
    if sleeper then pcall(sleeper.get, sleeper, 5) end
    if a1 then a1:stop() end
    if a2 then
      os.execute("kill -CONT " .. a2.pid)
      a2:stop()
    end
    if dir then os.execute("rm -rf " .. shq(dir)) end
  end)

  local TOP = RUN .. " --top --hosts "

  it("shows every host and proc with live fields, a killed proc's failure, a too small terminal; q restores it",
    function()
      start("top", TOP .. a1.addr .. "," .. a2.addr)
      local s = wait_screen("top", function(x)
        local r0, r1 = row(x, 0), row(x, 1)
        return r0 and r0.calls and r0.calls > 0 and r0.cpu and r0.cpu > 0 and r1 and r1.running == "sleep"
          and r1["for"] ~= "-" and row(x, 2) and row(x, 2).gpu ~= "-" and row(x, 3)
      end, "the busy proc's calls/s and CPU, the sleeping proc's kernel and the GPU memory")
      assert.matches("monarch top .* 2 hosts  4 procs", s)
      assert.matches("host %S+ %(" .. a1.addr:gsub("%.", "%%.") .. "%)  agent pid " .. a1.pid, s)
      assert.matches("host %S+ %(" .. a2.addr:gsub("%.", "%%.") .. "%)  agent pid " .. a2.pid, s)
      for rank = 0, 3 do
        local r = row(s, rank)
        assert.are.equal(pid_of(rank), r.pid)
        assert.are.equal("ready", r.state)
        assert.are.equal("attached", r.held)
        assert.matches("^[%d.]+[KMG]$", r.rss)
        assert.are.equal(rank == 2 and "3.0G" or "-", r.gpu)
      end
      assert.matches("^[%d.]+[sm]", row(s, 1)["for"])

      local victim = pid_of(3)
      os.execute("kill -9 " .. victim)
      s = wait_screen("top", has("failed: rank 3 pid " .. victim .. " killed by SIGKILL"), "the killed proc's failure")
      assert.is_nil(row(s, 3), "the killed proc is still listed")
      assert.is_truthy(row(s, 0), "the other procs are gone")

      tmux("resize-window -t top -x 50 -y 10")
      wait_screen("top", has("terminal too small (50x10)"), "that the terminal is too small")
      tmux("resize-window -t top -x 160 -y 40")
      wait_screen("top", function(x) return row(x, 0) ~= nil end, "the view again, at full size")

      tmux("send-keys -t top q")
      s = wait_screen("top", has("stty done"), "the exit status and the terminal's modes")
      assert.matches("top exited with 0\n", s)
      -- Restored: back from the alternate screen, the cursor shown, keys read by line and echoed again.
      assert.are.equal("0 1", (tmux("display -p -t top '#{alternate_on} #{cursor_flag}'"):gsub("%s+$", "")))
      for _, mode in ipairs { "icanon", "echo", "isig", "icrnl", "onlcr" } do
        assert.is_truthy(s:find("[ \n]" .. mode .. "[ \n]"), "the terminal's mode " .. mode .. " is off")
      end
      assert.is_nil(s:find("monarch top", 1, true), "the view is still on the screen")
    end)

  it("keeps refreshing the other hosts while one stops answering; Ctrl-C quits", function()
    start("silent", TOP .. a1.addr .. "," .. a2.addr)
    wait_screen("silent", function(x) return row(x, 0) and row(x, 2) end, "both hosts' procs")
    os.execute("kill -STOP " .. a2.pid)
    local s = wait_screen("silent", has("(" .. a2.addr .. ")  unreachable: "), "the silent host")
    assert.is_nil(row(s, 2), "the silent host's procs are still shown as if live")
    -- The other host is still asked every second: the age of its proc moves on.
    local up = row(s, 0).uptime
    wait_screen("silent", function(x) return row(x, 0) and row(x, 0).uptime ~= up end, "the other host refreshed")
    os.execute("kill -CONT " .. a2.pid)
    wait_screen("silent", function(x) return row(x, 2) ~= nil end, "the host back once it answers again")
    tmux("send-keys -t silent C-c")
    s = wait_screen("silent", has("top exited with"), "the exit status")
    assert.matches("top exited with 0\n", s)
  end)

  it("refuses a script, and needs a terminal that can draw", function()
    local out = sh(TOP .. a1.addr .. " script.lua 2>&1; echo rc=$?")
    assert.matches("%-%-top only watches the cluster", out)
    assert.matches("rc=2", out)
    out = sh("env MONARCH_TOKEN=" .. token .. " " .. TOP .. a1.addr .. " </dev/null 2>&1; echo rc=$?")
    assert.matches("standard input and output must be a terminal", out)
    assert.matches("rc=1", out)
    -- A terminal that cannot place its cursor would show nothing at all: refused, with why.
    start("dumb", "TERM=dumb " .. TOP .. a1.addr)
    local s = wait_screen("dumb", has("top exited with"), "the exit status")
    assert.matches("cannot move its cursor", s)
    assert.matches("top exited with 1\n", s)
  end)
end)

describe("top() in the REPL", function()
  local token, a, dir, sock

  local function tmux(args) return sh("tmux -S " .. shq(sock) .. " " .. args) end
  local function screen() return tmux("capture-pane -p -t repl") end
  local function wait_screen(pred, what)
    local t0 = monarch.now()
    local s
    repeat
      s = screen()
      if pred(s) then return s end
      pty.sleep(0.1)
    until monarch.now() - t0 > DEADLINE
    error(string.format("the screen never showed %s within %ds; it shows:\n%s", what, DEADLINE, s), 2)
  end
  local function has(text) return function(s) return s:find(text, 1, true) ~= nil end end
  local function type_line(line)
    tmux("send-keys -t repl -l " .. shq(line))
    tmux("send-keys -t repl Enter")
  end

  setup(function()
    monarch.hosts()
    token = runtime.token
    dir = sh("mktemp -d"):gsub("%s+$", "")
    sock = dir .. "/tmux.sock"
    a = agent.start{ token = token }
  end)

  teardown(function()
    if sock then tmux("kill-server") end
    if a then a:stop() end
    if dir then os.execute("rm -rf " .. shq(dir)) end
  end)

  it("shows the REPL's own procs, marked, and q returns to the prompt", function()
    local cmd = string.format("env MONARCH_TOKEN=%s MONARCH_HISTORY= %s -i --hosts %s; echo \"repl exited with $?\"; sleep 60",
      token, RUN, a.addr)
    assert.are.equal("", tmux("new-session -d -s repl -x 160 -y 40 " .. shq(cmd)))
    local function at_prompt(x) return x:gsub("%s+$", ""):sub(-8) == "monarch>" end
    wait_screen(at_prompt, "the prompt")
    type_line("procs = hosts:spawn_procs{procs = 2}")
    type_line("procs:load 'basic'")
    type_line("top()")
    local s = wait_screen(function(x) return x:find("attached*", 1, true) and x:find("\n +1 +%d+ +ready") end,
      "the REPL's procs")
    assert.matches("monarch top .* 1 hosts  2 procs", s)
    tmux("send-keys -t repl q")
    wait_screen(function(x) return not x:find("monarch top", 1, true) and at_prompt(x) end,
      "the prompt back, without the view")
    type_line("procs:call('rank'):get()")
    wait_screen(has("[hosts=0,procs=1] {1, 2}"), "a call answered after top()")
    tmux("send-keys -t repl C-d")
    s = wait_screen(has("repl exited with"), "the REPL's exit")
    assert.matches("repl exited with 0", s)
  end)
end)
