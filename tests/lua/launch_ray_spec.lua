-- monarch.launch_ray without Ray: the --ray options as monarch-run passes them, and the launcher's status lines.
local launch_ray = require "monarch.launch_ray"

local function no_env() return nil end

local function err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert.is_false(ok)
  return tostring(e)
end

describe("monarch.launch_ray.options", function()
  it("gives the defaults: 1 CPU per host, every node, no address but RAY_ADDRESS", function()
    local o = launch_ray.options(nil, no_env)
    assert.are.same({ cpus = 1, gpus = 0, hosts = 0, max_hosts = 0, timeout = launch_ray.START_TIMEOUT }, o)
    o = launch_ray.options({}, function(k) return k == "RAY_ADDRESS" and "10.0.0.1:6379" or nil end)
    assert.are.equal("10.0.0.1:6379", o.address)
  end)

  it("reads the strings monarch-run passes", function()
    local o = launch_ray.options({ address = "auto", hosts = "3", cpus = "2", gpus = "0.5", elastic = "true",
      ["max-hosts"] = "8", timeout = "5" }, no_env)
    assert.are.same({ address = "auto", hosts = 3, cpus = 2, gpus = 0.5, elastic = true, max_hosts = 8, timeout = 5 }, o)
  end)

  it("refuses a bad option in one line that names it", function()
    assert.matches("monarch: launch: ray: unknown option %-%-ray%-nodes %(known: %-%-ray%-cpus, ",
      err_of(launch_ray.options, { nodes = "3" }, no_env))
    assert.matches("%-%-ray%-hosts wants a whole number of at least 1, got '2.5'",
      err_of(launch_ray.options, { hosts = "2.5" }, no_env))
    assert.matches("%-%-ray%-cpus wants a non%-negative number, got 'x'", err_of(launch_ray.options, { cpus = "x" }, no_env))
    assert.matches("both 0", err_of(launch_ray.options, { cpus = "0" }, no_env))
    assert.matches("%-%-ray%-max%-hosts is for %-%-ray%-elastic", err_of(launch_ray.options, { ["max-hosts"] = "4" }, no_env))
    assert.matches("above", err_of(launch_ray.options, { hosts = "5", ["max-hosts"] = "4", elastic = "true" }, no_env))
    assert.matches("positive", err_of(launch_ray.options, { timeout = "0" }, no_env))
  end)
end)

describe("monarch.launch_ray.find", function()
  it("needs the job's token before it asks Ray anything, and --ray-job is only for it", function()
    assert.matches("%-%-status and %-%-top under %-%-ray need the job's cluster token",
      err_of(launch_ray.find, { ray = {} }, nil, no_env))
    assert.are.equal("train-7", launch_ray.options({ job = "train-7" }, no_env).job)
    assert.matches("%-%-ray%-job picks the job that %-%-status or %-%-top watches",
      err_of(launch_ray.start, { token = "t", worker = "w", config = { ray = { job = "x" } }, getenv = no_env }))
  end)
end)

describe("monarch.launch_ray.parse_line", function()
  it("reads each status line of deploy/ray/monarch_ray.py", function()
    assert.are.same({ what = "host", index = 2, node = "ab12", host = "n3", pid = 77 }, launch_ray.parse_line("host 2 ab12 n3 77"))
    assert.are.same({ what = "joined", index = 3, node = "cd", host = "n4", pid = 9 }, launch_ray.parse_line("joined 3 cd n4 9"))
    assert.are.same({ what = "ended", index = 1, why = "actor died: gone" }, launch_ray.parse_line("ended 1 actor died: gone"))
    assert.are.same({ what = "reserved", n = 3, name = "monarch:train-5" }, launch_ray.parse_line("reserved 3 monarch:train-5"))
    assert.are.same({ what = "pid", n = 42 }, launch_ray.parse_line("pid 42"))
    assert.are.same({ what = "node-dead", node = "ef", time = 1.5 }, launch_ray.parse_line("node-dead ef 1.500"))
    assert.are.same({ what = "error", text = "no Ray cluster at x:1" }, launch_ray.parse_line("error no Ray cluster at x:1"))
    assert.is_nil(launch_ray.parse_line(""))
  end)
end)
