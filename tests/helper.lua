-- Loaded by busted before any spec: the monarch library and its one
-- controller are shared by every spec file (busted's per-file insulation
-- would otherwise load a second copy over the same C core).
package.path = "lua/?.lua;lua/?/init.lua;tests/?.lua;" .. package.path
package.cpath = (os.getenv("MONARCH_BUILD") or "build") .. "/lib/monarch/lua/?.so;" .. package.cpath
require "monarch"
