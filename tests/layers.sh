#!/usr/bin/env bash
# The layers (docs/architecture.md): cli -> controller | agent | proc -> coll -> core.
# Each layer is compiled with only its own and lower include paths, so a
# header of a layer above or beside it must not be found. Checks that every
# such include fails, and that each layer still finds its own and lower ones
# (so a failure is the layering, not broken flags); and that the controller's
# engine includes no Lua header. Prints one line; exit 1 on a leak.
set -u
cd "$(dirname "$0")/.."
# Run from `make test` too (a recursive make): its flags must not add "Entering directory" lines.
mk() { env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS make --no-print-directory -s "$@"; }
pkg=$(mk print-PKG_CFLAGS)
# layer: headers it may include | headers it must not
rules=(
  "core:wire.h msg.h err.h|collective.h exec.h agent.h ctl.h"
  "coll:collective.h wire.h monarch_kernel.h|exec.h agent.h ctl.h"
  "proc:exec.h collective.h wire.h|agent.h ctl.h"
  "agent:agent.h wire.h|exec.h collective.h ctl.h"
  "controller:ctl.h wire.h|exec.h collective.h agent.h"
)
bad=0 checked=0
probe() { printf '#include "%s"\n' "$2" | ${CC:-cc} -fsyntax-only -D_GNU_SOURCE -x c - $1 $pkg 2>/dev/null; }
for r in "${rules[@]}"; do
  layer=${r%%:*} rest=${r#*:} may=${rest%%|*} mustnot=${rest#*|}
  inc=$(mk "print-INC_$layer")
  for h in $may; do
    checked=$((checked + 1))
    probe "$inc" "$h" || { echo "layers: $layer cannot include its own or a lower header $h"; bad=1; }
  done
  for h in $mustnot; do
    checked=$((checked + 1))
    if probe "$inc" "$h"; then echo "layers: $layer can include $h, which is above or beside it"; bad=1; fi
  done
done
# The controller's engine (ctl*.c, ctl*.h) includes no Lua header, directly or through another header:
# only its Lua bindings (core_*.c, core_lua_int.h, repl_lua.c) see Lua, so the engine can be driven without it.
inc=$(mk print-INC_controller)
engine=0
for f in host/controller/ctl*.c host/controller/ctl*.h; do
  engine=$((engine + 1))
  if ! deps=$(${CC:-cc} -M -D_GNU_SOURCE -x c $inc $pkg "$f" 2>/dev/null); then
    echo "layers: cannot list the includes of $f"
    bad=1
  elif grep -qE '(^|[ /])(lua|lauxlib|lualib)\.h' <<<"$deps"; then
    echo "layers: $f includes a Lua header (lua.h, lauxlib.h, lualib.h); only the controller's core_*.c bindings may"
    bad=1
  fi
done
[ "$bad" -eq 0 ] && echo "layers: $checked include checks, every wrong-way include fails; $engine controller engine files include no Lua header"
exit "$bad"
