-- The Jupyter kernel (monarch-run --jupyter-kernel), driven over its real
-- sockets by jupyter_client (Debian's python3-jupyter-client), against a
-- host agent run as a daemon so a persistent mesh outlives a restart. One
-- Python run (tests/support/jupyter_check.py) makes every check and prints a
-- line per check; each `it` reads its own. The example notebook runs headless
-- through nbclient, and in a real browser (the classic notebook server and
-- headless Chromium through selenium) where those are installed.
local core = require "monarch.core"
local agent = require "support.agent"

local B = os.getenv("MONARCH_BUILD") or "build"
local RUN = B .. "/bin/monarch-run"
-- Debian's python3 first (the python3-jupyter-client and python3-nbclient packages are for it).
local python = io.open("/usr/bin/python3", "rb") and "/usr/bin/python3" or "python3"

-- Runs cmd; its output (stdout and stderr) and exit status.
local function sh(cmd)
  local f = io.popen("(" .. cmd .. ") 2>&1; echo \"exit=$?\"")
  local out = f:read("*a")
  f:close()
  local body, code = out:match("^(.-)exit=(%d+)%s*$")
  return body or out, tonumber(code) or 1
end

local function has_module(m) return select(2, sh(python .. " -c 'import " .. m .. "'")) == 0 end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

describe("the Jupyter kernel", function()
  local token, daemon, dir, lines, edges
  local have_client = has_module("jupyter_client")

  setup(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir) == 0)
    if not have_client then return end
    token = core.generate_token()
    daemon = agent.start { token = token, env = "MONARCH_AGENT_GRACE=1", args = "--orphan-timeout 5" }
    local out = sh(string.format("MONARCH_TOKEN=%s timeout 300 %s tests/support/jupyter_check.py %s/check %s -- --hosts %s",
      token, python, dir, RUN, daemon.addr))
    lines = out
    edges = sh(string.format("MONARCH_TOKEN=%s timeout 300 %s tests/support/jupyter_edges.py %s/edges %s -- --hosts %s",
      token, python, dir, RUN, daemon.addr))
  end)

  teardown(function()
    if daemon then daemon:stop() end
    if dir then os.execute("rm -rf " .. dir) end
  end)

  local function result(name, from)
    if not have_client then pending("python3-jupyter-client is not installed (apt-get install python3-jupyter-client)") end
    from = from or lines
    local line = from:match("\n?(ok " .. name .. ")\n") or from:match("(FAIL " .. name .. ":[^\n]*)")
    assert(line, "no result for check '" .. name .. "'; the driver said:\n" .. from)
    assert.are.equal("ok " .. name, line)
  end

  it("answers kernel_info with protocol 5.3 and language lua", function() result("kernel_info") end)
  it("returns an expression's value as the cell's execute_result", function() result("execute_result") end)
  it("streams print, io.write and io.stderr to the cell", function() result("streams") end)
  it("shows an error as one line, a MonarchError by kind and message", function() result("errors") end)
  it("shows a plot as SVG display_data, also when a cell returns it", function() result("display_data_svg") end)
  it("updates a display in place (update_display_data)", function() result("update_display_data") end)
  it("shows a ValueMesh and a ProcMesh as HTML tables", function() result("mesh_html") end)
  it("shows a waiting cell's busy, input and first line while it waits", function() result("early_output") end)
  it("cancels a 30 s remote sleep on interrupt_request; the proc answers the next cell", function()
    result("interrupt_request")
  end)
  it("does the same on SIGINT", function() result("interrupt_sigint") end)
  it("stops waiting again on a second interrupt, after the cell caught the first; both calls are cancelled", function()
    result("second_interrupt")
  end)
  it("draws top() as an HTML table updated in place until interrupted", function() result("top_in_place") end)
  it("redraws a training run's curve in place (train_live, the training library)", function()
    result("train_curve_in_place")
  end)
  it("completes names with the REPL's completion", function() result("complete") end)
  it("inspects a function: its LDoc comment", function() result("inspect") end)
  it("answers is_complete, history and comm_info", function() result("is_complete_history_comms") end)
  it("ignores and logs a message with a bad signature", function() result("bad_signature") end)
  it("restarts: meshes stop, a persistent one stays and is named, and can be attached", function()
    result("restart")
  end)
  it("shuts down: exits 0 and stops its procs", function() result("shutdown") end)

  describe("at its edges", function()
    local function edge(name) result(name, edges) end
    it("shows an error for a value (or error) whose __tostring fails, and lives on", function()
      edge("unshowable_value")
    end)
    it("clamps a cursor_pos that is fractional, negative, infinite or NaN", function() edge("cursor_pos_clamped") end)
    it("refuses a signed message sent a second time", function() edge("replayed_message") end)
    it("refuses an execute_request on control while a cell runs; the cell can still be stopped", function()
      edge("execute_on_control_while_busy")
    end)
    it("sends a line printed before a long computation while the cell computes", function()
      edge("print_before_long_computation")
    end)
    it("shows the value of a last line that is a call, never returning from inside a block", function()
      edge("last_line_value")
    end)
    it("shows no value for what display() and io.write return; io.output() writes to the cell", function()
      edge("quiet_values")
    end)
    it("replaces bytes that are not UTF-8 in results, errors and displays", function() edge("not_utf8_everywhere") end)
    it("gives a MonarchError's traceback the cell's frames", function() edge("monarch_error_frames") end)
    it("evaluates user_expressions", function() edge("user_expressions") end)
    it("names the cell's line in top's and train_live's argument errors", function()
      edge("argument_errors_name_the_cell")
    end)
    it("says on train_live's picture that a run that failed stopped", function() edge("train_live_failure_picture") end)
    it("inspects top, train_live, display and hosts:spawn_procs: their own docs", function()
      edge("inspect_notebook_functions")
    end)
    it("reads input from the front end (input, io.read), refuses where it takes none, stops on interrupt", function()
      edge("stdin_input")
    end)
    it("stops, with its procs, when its front end dies without a shutdown", function() edge("front_end_dies") end)
  end)

  it("rejects a connection file that is not JSON in one line", function()
    local f = os.tmpname()
    local h = io.open(f, "w")
    h:write("not json")
    h:close()
    local out, code = sh(RUN .. " --jupyter-kernel " .. q(f))
    os.remove(f)
    assert.are.equal(2, code)
    assert.truthy(out:find("not a JSON object (a Jupyter connection file)", 1, true), out)
    out, code = sh(RUN .. " --jupyter-kernel /nonexistent/x.json")
    assert.are.equal(2, code)
    assert.truthy(out:find("cannot read the connection file", 1, true), out)
    out, code = sh(RUN .. " --install-kernel --bogus")
    assert.are.equal(2, code)
    assert.truthy(out:find("--install-kernel takes --user or --prefix DIR, not '--bogus'", 1, true), out)
  end)

  it("runs examples/notebook.ipynb, then notebook_attach.ipynb on its persistent mesh, headless (nbclient)", function()
    if not have_client then pending("python3-jupyter-client is not installed (apt-get install python3-jupyter-client)") end
    if not has_module("nbclient") then pending("python3-nbclient is not installed (apt-get install python3-nbclient)") end
    local out, code = sh(string.format("MONARCH_TOKEN=%s timeout 300 %s tests/support/run_notebook.py %s/nb %s " ..
      "examples/notebook.ipynb examples/notebook_attach.ipynb -- --hosts %s", token, python, dir, RUN, daemon.addr))
    assert.are.equal(0, code, out)
    assert.truthy(out:find("notebook ok", 1, true), out)
  end)

  it("runs the example in a real browser (notebook server, headless Chromium)", function()
    if not have_client then pending("python3-jupyter-client is not installed (apt-get install python3-jupyter-client)") end
    local missing = {}
    if not has_module("selenium") then missing[#missing + 1] = "python3-selenium" end
    if not has_module("notebook") then missing[#missing + 1] = "jupyter-notebook" end
    if select(2, sh("command -v chromedriver")) ~= 0 then missing[#missing + 1] = "chromium-driver" end
    if select(2, sh("command -v chromium")) ~= 0 then missing[#missing + 1] = "chromium" end
    if #missing > 0 then pending(table.concat(missing, ", ") .. " not installed (apt-get install them)") end
    local out, code = sh(string.format("MONARCH_TOKEN=%s timeout 300 %s tests/support/browser_notebook.py %s/br %s " ..
      "examples/notebook.ipynb -- --hosts %s", token, python, dir, RUN, daemon.addr))
    if code == 3 then pending("headless Chromium could not start here: " .. out:sub(-300)) end
    assert.are.equal(0, code, out)
    assert.truthy(out:find("browser ok", 1, true), out)
  end)
end)
