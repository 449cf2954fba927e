-- Shipping (issue 30): kernel libraries and files go from the controller to hosts that lack them. Each
-- host agent runs in a mount namespace of its own with a private /tmp (a tmpfs), so neither it nor its
-- procs can see the libraries this spec builds in the controller's /tmp: only shipping gets them there.
-- What an agent stored is read through /proc/<its pid>/root.
local monarch = require "monarch"
local mesh_mod = require "monarch.mesh"
local runtime = require "monarch.runtime"
local agent = require "support.agent"
local wait_for = require("support.wait").wait_for
local sh = require("support.shell").quiet

local KERNELS = (os.getenv("PWD") or ".") .. "/kernels"
-- A checkout under /tmp (a clean clone there) stays visible in it: bound aside to /mnt, then back over the tmpfs.
local REPO = os.getenv("PWD") or "."
local PRIVATE = ([[unshare -m --propagation private sh -c 'R=$1; shift; case "$R" in /tmp/*) mount --bind "$R" /mnt ]]
  .. [[&& mount -t tmpfs tmpfs /tmp && mkdir -p "$R" && mount --bind /mnt "$R";; *) mount -t tmpfs tmpfs /tmp;; esac ]]
  .. [[&& exec "$@"' sh '%s']]):format(REPO)

local can_unshare = sh("id -u | grep -qx 0") and sh("unshare -m --propagation private true")

local dir -- the controller's own temporary folder of libraries
local function build_lib(name, value, extra)
  local out = dir .. "/" .. name
  assert(sh(("cc -shared -fPIC -O2 -I%s -DVALUE=%d %s/k.c %s -o %s"):format(KERNELS, value, dir, extra or "", out)),
    "cc failed for " .. name)
  return out
end

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local function private_agent(args, env)
  return agent.start{ token = runtime.token, wrap = PRIVATE, args = "--ship-cache /tmp/cache " .. (args or ""),
    env = env }
end

-- The cached files (by hash; not their verification records) in a blobs folder.
local function blobs_in(path)
  local names = {}
  local f = io.popen("ls " .. path .. " 2>/dev/null")
  for l in f:lines() do
    if #l == 64 then names[#names + 1] = l end
  end
  f:close()
  return names
end

-- The cache's files as the agent sees them (its /tmp is its own).
local function blobs(d) return blobs_in("/proc/" .. d.pid .. "/root/tmp/cache/blobs") end

local function answers(m) return m:call("answer"):get(10):values() end

local function shipped(fn)
  local before = monarch.ship.stats().bytes
  fn()
  return monarch.ship.stats().bytes - before
end

describe("shipping to hosts that lack the files", function()
  local made, daemons = {}, {}

  setup(function()
    monarch.hosts()
    dir = os.tmpname()
    os.remove(dir)
    assert(sh("mkdir -p " .. dir))
    local f = assert(io.open(dir .. "/k.c", "wb"))
    f:write([[
#include "monarch_kernel.h"
#ifdef WITH_DEP
int dep_value(void);
#define RESULT dep_value()
#else
#define RESULT VALUE
#endif
static int k_answer(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) { (void)argc; (void)argv; return mk_return_int(ctx, RESULT); }
static const mk_kernel_t kernels[] = {{"answer", k_answer, "", "a number"}};
MK_EXPORT const mk_library_t *monarch_kernels(void) {
  static const mk_library_t lib = {MK_ABI_VERSION, "shiptest", 1, kernels};
  return &lib;
}
]])
    f:close()
  end)

  teardown(function()
    for _, m in ipairs(made) do pcall(m.stop, m) end
    for _, d in ipairs(daemons) do d:stop() end
    sh("rm -rf " .. dir)
  end)

  local function start(args, env)
    local d = private_agent(args, env)
    daemons[#daemons + 1] = d
    return d, mesh_mod.host_mesh(mesh_mod.connect_agents{ d.addr })
  end

  local function spawn(hosts, n)
    local m = hosts:spawn_procs{ procs = n or 2 }
    made[#made + 1] = m
    return m
  end

  before_each(function()
    if not can_unshare then pending("needs root and unshare -m (mount namespaces)") end
  end)

  it("loads a library the hosts cannot see, and serves a second load from their cache", function()
    local lib = build_lib("libfirst.so", 42)
    local d, hosts = start()
    local m = spawn(hosts)
    -- The agent cannot see the controller's /tmp: the library reaches it only by shipping.
    assert.is_nil(slurp("/proc/" .. d.pid .. "/root" .. lib))
    local size = #slurp(lib)
    assert.are.equal(size, shipped(function() m:load(lib) end))
    assert.are.same({ 42, 42 }, answers(m))
    assert.are.equal(1, #blobs(d))
    local m2 = spawn(hosts)
    assert.are.equal(0, shipped(function() m2:load(lib) end))
    assert.are.same({ 42, 42 }, answers(m2))
  end)

  it("ships again when a host's cache lost a library it said it had (another job evicted it)", function()
    local lib = build_lib("liblost.so", 13)
    local d, hosts = start()
    spawn(hosts, 1):load(lib)
    sh("rm -f /proc/" .. d.pid .. "/root/tmp/cache/blobs/*")
    local m = spawn(hosts, 1)
    assert.are.equal(#slurp(lib), shipped(function() m:load(lib) end))
    assert.are.same({ 13 }, answers(m))
  end)

  it("uses a library the host has at the same path with the same bytes as is", function()
    local lib = build_lib("libshared.so", 5)
    local d = agent.start{ token = runtime.token, args = "--ship-cache " .. dir .. "/cache-shared" }
    daemons[#daemons + 1] = d
    local m = spawn(mesh_mod.host_mesh(mesh_mod.connect_agents{ d.addr }))
    assert.are.equal(0, shipped(function() m:load(lib) end))
    assert.are.same({ 5, 5 }, answers(m))
  end)

  it("refuses a transfer corrupted in flight", function()
    local lib = build_lib("libcorrupt.so", 7)
    local _, hosts = start(nil, "MONARCH_TEST_SHIP_FLIP=1")
    local m = spawn(hosts, 1)
    local ok, err = pcall(m.load, m, lib)
    assert.is_false(ok)
    assert.matches("hash to", tostring(err))
    assert.matches("refused", tostring(err))
    assert.are.equal("load", err.kind)
  end)

  it("refuses a library built for another machine, naming the host and both machines", function()
    local lib = build_lib("libother.so", 1)
    local bytes = slurp(lib)
    local other = dir .. "/libaarch64.so" -- e_machine (bytes 18-19, little-endian) set to EM_AARCH64 (183)
    local f = assert(io.open(other, "wb"))
    f:write(bytes:sub(1, 18) .. string.char(183, 0) .. bytes:sub(21))
    f:close()
    local d, hosts = start()
    local m = spawn(hosts, 1)
    local before = monarch.ship.stats().bytes
    local ok, err = pcall(m.load, m, other)
    assert.is_false(ok)
    local msg = tostring(err)
    assert.matches("built for aarch64", msg, 1, true)
    assert.matches("runs x86_64", msg, 1, true)
    assert.matches(d.addr:match(":(%d+)$"), msg, 1, true)
    assert.are.equal(before, monarch.ship.stats().bytes) -- refused before a byte travelled
    ok, err = pcall(m.load, m, dir .. "/k.c")
    assert.is_false(ok)
    assert.matches("not an ELF file", tostring(err), 1, true)
  end)

  it("names a library the shipped one needs that the host lacks", function()
    local f = assert(io.open(dir .. "/dep.c", "wb"))
    f:write("int dep_value(void) { return 9; }\n")
    f:close()
    assert(sh(("cc -shared -fPIC -o %s/libshipdep.so %s/dep.c"):format(dir, dir)))
    local lib = build_lib("libneedsdep.so", 0, ("-DWITH_DEP -L%s -lshipdep"):format(dir))
    local _, hosts = start()
    local m = spawn(hosts, 1)
    local ok, err = pcall(m.load, m, lib)
    assert.is_false(ok)
    assert.matches("libshipdep.so", tostring(err), 1, true)
  end)

  it("refuses with --no-ship", function()
    local lib = build_lib("libnoship.so", 3)
    local _, hosts = start("--no-ship")
    local m = spawn(hosts, 1)
    local ok, err = pcall(m.load, m, lib)
    assert.is_false(ok)
    assert.matches("--no-ship", tostring(err), 1, true)
    assert.matches("libnoship.so", tostring(err), 1, true)
  end)

  it("evicts the least recently used files past the cache's cap", function()
    local libs = {}
    for i = 1, 3 do libs[i] = build_lib("libevict" .. i .. ".so", 100 + i, "-DPAD=20000") end
    local size = #slurp(libs[1])
    local d, hosts = start("--ship-cache-max " .. math.floor(size * 2.5))
    local m = spawn(hosts, 1)
    m:load(libs[1])
    m:load(libs[2])
    assert.are.equal(2, #blobs(d))
    m:load(libs[3]) -- three do not fit: the oldest goes
    local left = blobs(d)
    assert.are.equal(2, #left)
    local first = require("monarch.core").ship_hash(slurp(libs[1]))
    for _, b in ipairs(left) do assert.are_not.equal(first, b) end
    assert.are.same({ 103 }, answers(m))
    -- Gone from the cache, it is shipped again when a new mesh loads it.
    local m2 = spawn(hosts, 1)
    assert.are.equal(size, shipped(function() m2:load(libs[1]) end))
  end)

  it("gives a restarted proc its library, shipping it again if its cache lost it", function()
    local lib = build_lib("librestart.so", 11)
    local d, hosts = start()
    local m = spawn(hosts, 1):options{ restart = true }
    m:load(lib)
    local p = m:proc_list()[1]
    local old = p.pid
    sh("rm -f /proc/" .. d.pid .. "/root/tmp/cache/blobs/*")
    local before = monarch.ship.stats().bytes
    sh("kill -9 " .. old)
    wait_for(function() return p.pid ~= old and p.state == "ready" end, 20, "the proc to restart")
    assert.are.same({ 11 }, answers(m))
    assert.are.equal(#slurp(lib), monarch.ship.stats().bytes - before)
  end)

  it("gives procs on a host that joined the mesh's libraries", function()
    local lib = build_lib("libgrow.so", 21)
    local _, hosts = start()
    local m = spawn(hosts, 1)
    m:load(lib)
    local d2 = private_agent()
    daemons[#daemons + 1] = d2
    local grown, added = m:grow(mesh_mod.connect_agents{ d2.addr })
    made[#made + 1] = added
    assert.are.same({ 21 }, answers(added))
    assert.are.same({ 21, 21 }, answers(grown))
  end)

  it("lets two jobs' agents share one cache", function()
    local lib = build_lib("libtwo.so", 8)
    -- Outside /tmp, which each agent has a private one of: this folder they share.
    local cache = (os.getenv("PWD") or ".") .. "/" .. (os.getenv("MONARCH_BUILD") or "build") .. "/ship-two-" ..
      require("support.netns").ID
    sh("rm -rf " .. cache)
    local a1 = agent.start{ token = runtime.token, wrap = PRIVATE, args = "--ship-cache " .. cache }
    local a2 = agent.start{ token = runtime.token, wrap = PRIVATE, args = "--ship-cache " .. cache }
    daemons[#daemons + 1], daemons[#daemons + 2] = a1, a2
    -- Both lack it (the cache dir is outside their private /tmp, so they share it; the library is not).
    local m = spawn(mesh_mod.host_mesh(mesh_mod.connect_agents{ a1.addr, a2.addr }), 1)
    m:load(lib)
    assert.are.same({ 8, 8 }, answers(m))
    local n = #blobs_in(cache .. "/blobs")
    sh("rm -rf " .. cache)
    assert.are.equal(1, n)
  end)

  -- Agents of one user on one machine (one per GPU) share its cache: the bytes travel to it once.
  local function shared_pair(tag)
    local cache = (os.getenv("PWD") or ".") .. "/" .. (os.getenv("MONARCH_BUILD") or "build") .. "/ship-" .. tag ..
      "-" .. require("support.netns").ID
    sh("rm -rf " .. cache)
    finally(function() sh("rm -rf " .. cache) end)
    local a1 = agent.start{ token = runtime.token, wrap = PRIVATE, args = "--ship-cache " .. cache }
    local a2 = agent.start{ token = runtime.token, wrap = PRIVATE, args = "--ship-cache " .. cache }
    local a3 = private_agent() -- a cache of its own: it gets its own copy
    daemons[#daemons + 1], daemons[#daemons + 2], daemons[#daemons + 3] = a1, a2, a3
    -- Every copy from the controller itself (the agents the spec started before may make a cast tree): counted.
    finally(function() monarch.configure{ fanout = 16 } end)
    monarch.configure{ fanout = 0 }
    return cache, mesh_mod.host_mesh(mesh_mod.connect_agents{ a1.addr, a2.addr, a3.addr })
  end

  it("sends a file once to agents that share a cache", function()
    local lib = build_lib("libdedupe.so", 31)
    local cache, hosts = shared_pair("dedupe")
    local m = spawn(hosts, 1)
    local size = #slurp(lib)
    assert.are.equal(2 * size, shipped(function() m:load(lib) end)) -- one copy for the pair, one for the third
    assert.are.same({ 31, 31, 31 }, answers(m))
    assert.are.equal(1, #blobs_in(cache .. "/blobs"))
    local id = slurp(cache .. "/id")
    assert.are.equal(33, #id)
    assert.are.equal(id:sub(1, 32), hosts.agents[1].cache_id)
    assert.are.equal(hosts.agents[1].cache_id, hosts.agents[2].cache_id)
    assert.are_not.equal(hosts.agents[1].cache_id, hosts.agents[3].cache_id)
  end)

  it("loads on an agent whose cache id was copied with its cache but whose cache lacks the file", function()
    local lib = build_lib("libcopiedid.so", 34)
    local base = (os.getenv("PWD") or ".") .. "/" .. (os.getenv("MONARCH_BUILD") or "build") .. "/ship-copied-" ..
      require("support.netns").ID
    finally(function() sh("rm -rf " .. base) end)
    -- Two caches with one id, as an image copied with its cache makes: told as one in WELCOME, but not one.
    assert(sh(("rm -rf %s && mkdir -p -m 700 %s/a %s/b && printf '%%s\\n' %s > %s/a/id && cp %s/a/id %s/b/id")
      :format(base, base, base, string.rep("ab", 16), base, base, base)))
    local a1 = agent.start{ token = runtime.token, wrap = PRIVATE, args = "--ship-cache " .. base .. "/a" }
    local a2 = agent.start{ token = runtime.token, wrap = PRIVATE, args = "--ship-cache " .. base .. "/b" }
    daemons[#daemons + 1], daemons[#daemons + 2] = a1, a2
    finally(function() monarch.configure{ fanout = 16 } end)
    monarch.configure{ fanout = 0 }
    local hosts = mesh_mod.host_mesh(mesh_mod.connect_agents{ a1.addr, a2.addr })
    assert.are.equal(hosts.agents[1].cache_id, hosts.agents[2].cache_id)
    local m = spawn(hosts, 1)
    local size = #slurp(lib)
    -- One copy for the "pair"; the load fails as "ship:" on the one that lacks it, which is then sent its own.
    assert.are.equal(2 * size, shipped(function() m:load(lib) end))
    assert.are.same({ 34, 34 }, answers(m))
    assert.are.equal(1, #blobs_in(base .. "/a/blobs"))
    assert.are.equal(1, #blobs_in(base .. "/b/blobs"))
  end)

  it("checks a shared cache's file again after it changed, and fetches it anew", function()
    local lib = build_lib("libtamper.so", 32)
    local cache, hosts = shared_pair("tamper")
    local m = spawn(hosts, 1)
    m:load(lib)
    local hex = require("monarch.core").ship_hash(slurp(lib))
    local blob = cache .. "/blobs/" .. hex
    -- A byte in the middle changed on disk (the mtime moves, as with any write): its record no longer holds.
    assert(sh(("chmod u+w %s && printf 'X' | dd of=%s bs=1 seek=30000 conv=notrunc status=none && chmod 500 %s")
      :format(blob, blob, blob)))
    local m2 = spawn(hosts, 1)
    local size = #slurp(lib)
    assert.are.equal(size, shipped(function() m2:load(lib) end)) -- refused by the pair's procs, fetched once
    assert.are.same({ 32, 32, 32 }, answers(m2))
    assert.are.equal(slurp(lib), slurp(blob))
  end)

  it("syncs files and folders into the job workspace, sending only what changed", function()
    local data = dir .. "/data"
    assert(sh("mkdir -p " .. data .. "/sub"))
    local function random_file(path, n)
      local f = assert(io.open(path, "wb"))
      f:write(assert(io.open("/dev/urandom", "rb")):read(n))
      f:close()
    end
    random_file(data .. "/a.bin", 300000)
    random_file(data .. "/sub/b.txt", 1024)
    local d, hosts = start()
    local m = spawn(hosts, 1)
    local r = hosts:sync{ data .. "/" }
    assert.are.equal(2, r.files)
    assert.are.equal(301024, r.bytes)
    local env = require("support.procstat").environ(m:proc_list()[1].pid)
    local ws = env:match("MONARCH_WORKSPACE=([^%z]+)")
    assert.is_truthy(ws)
    local root = "/proc/" .. d.pid .. "/root"
    assert.are.equal(slurp(data .. "/a.bin"), slurp(root .. ws .. "/data/a.bin"))
    assert.are.equal(slurp(data .. "/sub/b.txt"), slurp(root .. ws .. "/data/sub/b.txt"))
    random_file(data .. "/sub/b.txt", 1024)
    r = hosts:sync{ data }
    assert.are.equal(1024, r.bytes)
    assert.are.equal(1, r.shipped)
    assert.are.equal(slurp(data .. "/sub/b.txt"), slurp(root .. ws .. "/data/sub/b.txt"))
    local ok, err = pcall(hosts.sync, hosts, { dir .. "/missing" })
    assert.is_false(ok)
    assert.matches("no such file or folder", tostring(err), 1, true)
  end)

  it("gives a host whose procs start after a sync what was synced, before they start", function()
    local data = dir .. "/late"
    assert(sh("mkdir -p " .. data))
    local f = assert(io.open(data .. "/words.txt", "wb"))
    f:write(string.rep("late host ", 20))
    f:close()
    local d1, hosts = start()
    local m = spawn(hosts, 1)
    assert.are.equal(1, hosts:sync{ data }.shipped)
    -- A host grown onto the mesh later (as after a join): its workspace has the file when its proc runs.
    local d2, later = start()
    local _, added = m:grow(later)
    made[#made + 1] = added
    local env = require("support.procstat").environ(added:proc_list()[1].pid)
    local ws = assert(env:match("MONARCH_WORKSPACE=([^%z]+)"))
    assert.are.equal(slurp(data .. "/words.txt"), slurp("/proc/" .. d2.pid .. "/root" .. ws .. "/late/words.txt"))
    -- The first host is not sent it again; a second sync of the unchanged folder sends nothing.
    assert.are.equal(0, hosts:sync{ data }.bytes)
    assert.is_truthy(d1.pid)
  end)

  it("sends through the cast tree: the controller writes one copy per top agent", function()
    local lib = build_lib("libtree.so", 4, "-DPAD=100000")
    local core = require "monarch.core"
    -- Eight simulated hosts, a process (and so a pretend cache) each: each needs its own copy.
    local addrs = {}
    for i = 1, 8 do
      local d = agent.start{ token = runtime.token, args = "--simulate --ship-cache /nonexistent" }
      daemons[#daemons + 1] = d
      addrs[i] = d.addr
    end
    finally(function() monarch.configure{ cast_min = 16, fanout = 16 } end)
    monarch.configure{ cast_min = 2, fanout = 2 }
    local m = spawn(mesh_mod.host_mesh(mesh_mod.connect_agents(addrs)), 1)
    wait_for(function()
      m:call("noop"):get(10)
      return core.cast_stats().routed >= 6
    end, 10, "the simulated hosts' tree links")
    local size = #slurp(lib)
    local sent = shipped(function() m:load(lib) end)
    assert.is_true(sent >= size and sent <= 2 * size, "the controller wrote " .. sent / size .. " copies")
    assert.are.equal(0, shipped(function() m:load(lib) end)) -- every simulated host verified and kept its hash
  end)

  it("sends one copy to the simulated hosts of one process (they share its pretend cache)", function()
    local lib = build_lib("libsimgroup.so", 33)
    local group = agent.start{ token = runtime.token, args = "--simulate --hosts 8", hosts = 8 }
    daemons[#daemons + 1] = group
    finally(function() monarch.configure{ fanout = 16 } end)
    monarch.configure{ fanout = 0 } -- every copy from the controller itself: counted
    local hosts = mesh_mod.host_mesh(mesh_mod.connect_agents(group.addrs))
    local m = spawn(hosts, 1)
    assert.are.equal(#slurp(lib), shipped(function() m:load(lib) end))
    assert.is_truthy(hosts.agents[1].cache_id)
    for _, a in ipairs(hosts.agents) do assert.are.equal(hosts.agents[1].cache_id, a.cache_id) end
  end)

  it("ships a CUDA library built with nvcc, loaded against the fake CUDA runtime", function()
    if not sh("command -v nvcc") then pending("nvcc is not installed") end
    local build = os.getenv("MONARCH_BUILD") or "build"
    local fake = (build:sub(1, 1) == "/" and build or (os.getenv("PWD") or ".") .. "/" .. build) ..
      "/tests/libmonarch_fakegpu.so"
    if not slurp(fake) then pending(fake .. " is not built (make tests)") end
    local cu = dir .. "/k.cu"
    local f = assert(io.open(cu, "wb"))
    f:write((slurp(dir .. "/k.c"):gsub("#include \"monarch_kernel.h\"",
      "#include \"monarch_kernel.h\"\n__global__ void twice(float *x) { x[threadIdx.x] *= 2; }")
      :gsub("MK_EXPORT const", "extern \"C\" MK_EXPORT const")))
    f:close()
    local lib = dir .. "/libcudaship.so"
    assert(sh(("nvcc -shared -Xcompiler -fPIC -cudart shared -DVALUE=77 -I%s %s -o %s"):format(KERNELS, cu, lib)),
      "nvcc failed")
    local _, hosts = start(nil, ("MONARCH_CUDART='%s' MONARCH_NCCL='%s' CUDA_VISIBLE_DEVICES="):format(fake, fake))
    local m = spawn(hosts, 1)
    assert.are.equal(#slurp(lib), shipped(function() m:load(lib) end))
    assert.are.same({ 77 }, answers(m))
  end)
end)
