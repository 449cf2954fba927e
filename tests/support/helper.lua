-- Loaded by busted before any spec: the monarch library and its one
-- controller are shared by every spec file (busted's per-file insulation
-- would otherwise load a second copy over the same C core).
package.path = "lua/?.lua;lua/?/init.lua;tests/?.lua;" .. package.path
package.cpath = (os.getenv("MONARCH_BUILD") or "build") .. "/lib/monarch/lua/?.so;" .. package.cpath
require "monarch"

-- tests/run.sh preloads the ASan runtime into busted for an ASan build; the
-- processes the specs start (sh, pgrep, workers) must not inherit it.
local preload = os.getenv("LD_PRELOAD")
if preload and preload:find("libasan", 1, true) then
  local ffi = require "ffi"
  ffi.cdef "int unsetenv(const char *);"
  ffi.C.unsetenv("LD_PRELOAD")
end
