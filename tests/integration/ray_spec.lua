-- monarch-run --ray (issue 32): a real Ray cluster on this machine (a head
-- and two more nodes, each its own raylet: tests/support/ray_cluster.lua)
-- allocates the hosts; examples/train.lua runs over them, shrinks when a
-- node's raylet is killed, grows onto a node added with --ray-elastic; the
-- end of a job, or the controller's kill -9, leaves no placement group, actor
-- or agent behind; --status and --top under --ray watch a running job. Pending
-- where ray cannot be imported (.ci/run installs it).
local shell = require "support.shell"
local wait_for = require("support.wait").wait_for
local ray_cluster = require "support.ray_cluster"

local B = os.getenv("MONARCH_BUILD") or "build"
local sh = shell.run

local py, why = ray_cluster.python()
if not py then
  describe("monarch-run --ray", function()
    pending("skipped: " .. why)
  end)
  print("ray_spec: skipped: " .. why)
  return
end

local AGENTS = "[m]onarch-worker --listen 0.0.0.0:0 --once --parent [0-9]+ --join" -- what the actors run
local TIMEOUT = 120 -- seconds any one job here may take

-- A fresh directory for one test's files.
local function scratch()
  local d = (sh("mktemp -d /tmp/monarch-rayspec.XXXXXX")):match("(%S+)")
  finally(function() os.execute("rm -rf " .. d) end)
  return d
end

local function run_cmd(c, args)
  return ("MONARCH_RAY_PYTHON=%s OPENBLAS_NUM_THREADS=1 timeout %d %s/bin/monarch-run --ray %s %s"):format(
    py, TIMEOUT, B, c.address, args)
end

-- Starts monarch-run in the background; returns the output file and the pid file.
local function background(cmd, dir)
  local out, pidf = dir .. "/out", dir .. "/pid"
  os.execute(("sh -c '%s >%s 2>&1 & echo $! >%s; wait $!; echo \"::rc=$?\" >>%s' &"):format(
    cmd:gsub("'", "'\\''"), out, pidf, out))
  return out, pidf
end

local function output(path) return shell.exists(path) and shell.read(path) or "" end

local function expect(path, pattern, timeout)
  return (wait_for(function() return output(path):match(pattern) end, timeout or TIMEOUT,
    function() return "'" .. pattern .. "' in:\n" .. output(path) end))
end

-- Nothing of a job is left: no placement group, no actor, no agent process.
local function assert_nothing_left(c)
  local s
  wait_for(function()
    s = c:state()
    return s.pgs == 0 and s.actors == 0 and select(2, sh("pgrep -f '" .. AGENTS .. "'")) ~= 0
  end, 60, function()
    return ("the job's leftovers to go: %d placement groups, %d actors, agents: %s"):format(
      s.pgs, s.actors, (sh("pgrep -af '" .. AGENTS .. "'")))
  end)
end

describe("monarch-run --ray on a local Ray cluster of 3 nodes", function()
  local c

  setup(function() c = ray_cluster.start { nodes = 3, cpus = 1 } end)
  teardown(function() if c then c:stop() end end)

  it("trains examples/train.lua over the 3 nodes and leaves nothing behind", function()
    local dir = scratch()
    local data_arg = require("support.digits").data_arg(dir)
    local out, rc = sh(run_cmd(c, "examples/train.lua --device cpu --procs 2 --steps 200 --quiet --checkpoint-dir "
      .. dir .. "/ck" .. data_arg))
    assert.are.equal(0, rc, out)
    assert.matches("ray: 3 hosts in placement group monarch:train%-%d+", out)
    assert.matches("weights identical on all 6 procs", out)
    assert_nothing_left(c)
  end)

  it("gives one clear error, not a hang, when the cluster lacks the hosts asked for", function()
    local out, rc = sh(run_cmd(c, "--ray-hosts 4 --ray-timeout 3 tests/support/ray_job.lua"))
    assert.are.equal(1, rc, out) -- not 124: the launcher's own timeout ended it
    assert.matches("monarch%-run: monarch: launch: ray: Ray could not place 4 host bundle%(s%) of {CPU: 1}, one per "
      .. "node %(STRICT_SPREAD%), within 3s: the cluster has 3 alive node%(s%)", out)
    assert.not_matches("traceback", out)
    assert_nothing_left(c)
  end)

  it("leaves no placement group, actor or agent behind when the controller is killed with SIGKILL", function()
    local dir = scratch()
    local out, pidf = background(run_cmd(c, "tests/support/ray_job.lua 300"), dir)
    expect(out, "hosts 3 procs 6 first call")
    assert.are.equal(3, c:state().actors)
    local pid = expect(pidf, "(%d+)")
    -- timeout(1) is the pid we know; monarch-run is its child.
    local child = (sh("pgrep -P " .. pid)):match("(%d+)")
    assert.is_string(child, "monarch-run is not running under timeout " .. pid)
    os.execute("kill -9 " .. child)
    expect(out, "::rc=%d+")
    assert_nothing_left(c)
  end)

  it("keeps the job's hosts through a Ctrl-C at monarch-run --ray -i: it stops the wait, not the launcher", function()
    local pty = require "support.pty"
    local t = pty.spawn({ B .. "/bin/monarch-run", "--ray", c.address, "-i" },
      { MONARCH_RAY_PYTHON = py, OPENBLAS_NUM_THREADS = "1", TERM = "xterm" })
    finally(function() t:close() end)
    t:expect("ray: 3 hosts in placement group", TIMEOUT)
    t:expect("monarch> ", 30)
    local function run(line, timeout)
      t:ready()
      t:send(line .. "\n")
      return t:expect("monarch> ", timeout or 30)
    end
    run("procs = hosts:spawn_procs{procs = 1}; procs:load 'basic'", 60)
    t:ready()
    t:send("procs:call('sleep', 30):get()\n")
    t:pump(1)
    t:send("\3") -- the terminal's SIGINT, to monarch-run and the launcher alike
    t:expect("interrupted", 5)
    t:expect("monarch> ", 5)
    local out = run("#procs:call('rank'):get():values()")
    assert.matches("\n3\n", out, 1, true)
    assert.not_matches("host_lost", out)
    assert.not_matches("KeyboardInterrupt", pty.plain(t.out))
    assert.are.equal(3, c:state().actors)
    t:ready()
    t:send("\4")
    assert.are.equal(0, t:wait(30), pty.plain(t.out))
    assert_nothing_left(c)
  end)

  it("lets --status and --top under --ray watch the running job's hosts, given its token", function()
    local dir = scratch()
    local tok = "ray-spec-token"
    local out, pidf = background("MONARCH_TOKEN=" .. tok .. " " .. run_cmd(c, "tests/support/ray_job.lua 300"), dir)
    expect(out, "hosts 3 procs 6 first call")
    local watch = ("MONARCH_RAY_PYTHON=%s timeout %d %s/bin/monarch-run --ray %s "):format(py, TIMEOUT, B, c.address)
    local st, rc = sh("MONARCH_TOKEN=" .. tok .. " " .. watch .. "--status")
    assert.are.equal(0, rc, st)
    local _, hosts = st:gsub("\nhost ", "")
    assert.are.equal(3, hosts + (st:match("^host ") and 1 or 0), st)
    for rank = 0, 5 do assert.matches("\n%s+" .. rank .. "%s+%d+ attached", st) end
    local first = st:match("host [^\n]*\n(.-)\nhost ") or "" -- host 0 (bundle 0) first, with ranks 0 and 1
    assert.matches("\n%s+0%s+%d+ attached", "\n" .. first, st)
    assert.matches("\n%s+1%s+%d+ attached", first, st)
    local no_tok = sh("MONARCH_TOKEN= " .. watch .. "--status")
    assert.matches("^monarch%-run: monarch: launch: ray: %-%-status and %-%-top under %-%-ray need the job's cluster token", no_tok)
    local other = sh("MONARCH_TOKEN=" .. tok .. " " .. watch .. "--ray-job nope --status")
    assert.matches("^monarch%-run: monarch: launch: ray: no monarch job nope runs on this Ray cluster %(ray_job%-%d+%)\n$", other)
    -- --top on a terminal (tmux on a socket of this test's own): the 3 hosts and 6 procs, then q.
    local sock = dir .. "/tmux.sock"
    local function tmux(args) return sh("tmux -S " .. sock .. " " .. args) end
    finally(function() tmux("kill-server") end)
    -- Not under timeout(1), which would keep it out of the terminal's foreground (the session ends it).
    local top = ("MONARCH_RAY_PYTHON=%s %s/bin/monarch-run --ray %s --top"):format(py, B, c.address)
    tmux(("new-session -d -s top -x 160 -y 40 \"MONARCH_TOKEN=%s %s; echo top exited with \\$?; sleep 60\""):format(tok, top))
    wait_for(function() return tmux("capture-pane -p -t top"):find("3 hosts  6 procs", 1, true) end, 60,
      function() return "--top to show 3 hosts and 6 procs:\n" .. tmux("capture-pane -p -t top") end)
    tmux("send-keys -t top q")
    wait_for(function() return tmux("capture-pane -p -t top"):find("top exited with 0", 1, true) end, 30,
      function() return "--top to quit on q:\n" .. tmux("capture-pane -p -t top") end)
    local pid = expect(pidf, "(%d+)")
    os.execute("kill -9 " .. (sh("pgrep -P " .. pid)):match("(%d+)"))
    expect(out, "::rc=%d+")
    assert_nothing_left(c)
  end)

  it("shrinks the job when a node's raylet is killed mid-run, and training finishes on the survivors", function()
    local dir = scratch()
    local data_arg = require("support.digits").data_arg(dir)
    local out = background(run_cmd(c, "examples/train.lua --device cpu --procs 2 --steps 12000 --log-every 200 "
      .. "--checkpoint-dir " .. dir .. "/ck" .. data_arg), dir)
    expect(out, "step 400/12000")
    c:kill_node(3)
    local rc = tonumber(expect(out, "::rc=(%d+)"))
    local text = output(out)
    assert.are.equal(0, rc, text)
    assert.matches("host_lost", text)
    assert.matches("training goes on with 4 procs on 2 hosts from step %d+", text)
    assert.matches("weights identical on all 4 procs", text)
    assert_nothing_left(c)
  end)

  it("with --ray-elastic, gives a node added later to the job: it joins and trains", function()
    local dir = scratch()
    local data_arg = require("support.digits").data_arg(dir)
    -- The head and node 2: node 3 was killed above, and Ray marks a node dead only after its
    -- health checks fail (seconds after the kill; the job above may end first).
    wait_for(function() return c:state().nodes == 2 end, 120,
      function() return "Ray to mark the killed node dead: " .. c:state().nodes .. " nodes alive" end)
    local out = background(run_cmd(c, "--ray-elastic --ray-max-hosts 3 examples/train.lua --device cpu --procs 2 "
      .. "--steps 300 --quiet --wait-join-at 30 --checkpoint-dir " .. dir .. "/ck" .. data_arg), dir)
    expect(out, "waiting for a host to join")
    c:add_node(1)
    local rc = tonumber(expect(out, "::rc=(%d+)"))
    local text = output(out)
    assert.are.equal(0, rc, text)
    assert.matches("ray: node %x+ added %(host 2%)", text)
    assert.matches("1 host%(s%) joined with 2 procs; training goes on with 6 procs on 3 hosts", text)
    assert.matches("weights identical on all 6 procs", text)
    assert_nothing_left(c)
  end)
end)
