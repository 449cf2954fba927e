-- `make install` as a kernel author outside this tree meets it: the installed
-- binaries run from their prefix, and a library built with nothing but
-- `pkg-config --cflags monarch-kernel` loads on the installed procs.
local B = os.getenv("MONARCH_BUILD") or "build"

local function sh(cmd)
  local f = io.popen(cmd .. " 2>&1; echo \"::rc=$?\"")
  local out = f:read("*a")
  f:close()
  local rc = tonumber(out:match("::rc=(%d+)%s*$"))
  return out:gsub("::rc=%d+%s*$", ""), rc
end

local LIB = [[
#include "monarch_kernel.h"

static int twice(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  return mk_return_int(ctx, 2 * argv[0].v.i);
}

static const mk_kernel_t kernels[] = {{"twice", twice, "i", "twice(i): 2 * i"}};

MK_EXPORT const mk_library_t *monarch_kernels(void) {
  static const mk_library_t lib = {MK_ABI_VERSION, "outside", 1, kernels};
  return &lib;
}
]]

describe("make install", function()
  local prefix, dir

  setup(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. dir))
    prefix = dir .. "/prefix"
    local out, rc = sh(string.format("make --no-print-directory install BUILD=%s PREFIX=%s", B, prefix))
    assert(rc == 0, out)
  end)

  teardown(function()
    if dir then os.execute("rm -rf " .. dir) end
  end)

  it("installs a pkg-config file that names the kernel header and the version", function()
    local env = "PKG_CONFIG_PATH=" .. prefix .. "/lib/pkgconfig "
    local cflags, rc = sh(env .. "pkg-config --cflags monarch-kernel")
    assert.are.equal(0, rc, cflags)
    assert.matches("-I" .. prefix:gsub("%p", "%%%0") .. "/include", cflags)
    local version = sh(env .. "pkg-config --modversion monarch-kernel")
    local run = sh(prefix .. "/bin/monarch-run --version")
    assert.matches("^monarch%-run " .. version:gsub("%s+$", ""):gsub("%p", "%%%0") .. " ", run)
  end)

  it("builds a library outside the tree with pkg-config and runs it on the installed procs", function()
    local src = io.open(dir .. "/outside.c", "w")
    src:write(LIB)
    src:close()
    local out, rc = sh(string.format(
      "cd %s && export PKG_CONFIG_PATH=%s/lib/pkgconfig && cc -std=gnu11 -Wall -Wextra -Werror -shared -fPIC " ..
      "-fvisibility=hidden $(pkg-config --cflags monarch-kernel) outside.c -o outside.so", dir, prefix))
    assert.are.equal(0, rc, out)
    local script = string.format([[
      local monarch = require "monarch"
      local procs = monarch.hosts():spawn_procs{ procs = 2 }
      procs:load "%s/outside.so"
      local v = procs:call("twice", 21):get()
      print("answers", v[1], v[2])
    ]], dir)
    out, rc = sh(string.format("cd %s && env -u MONARCH_PREFIX -u MONARCH_KERNEL_DIR %s/bin/monarch-run -e '%s'", dir, prefix, script))
    assert.are.equal(0, rc, out)
    assert.matches("answers\t42\t42", out)
  end)
end)
