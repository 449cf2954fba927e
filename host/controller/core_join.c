/* core_join.c - monarch.core's join port (ctl_join.c): core.listen opens it, core.joins reports what came. */
#include "core_lua_int.h"
#include "sock.h"

/* core.listen("HOST:PORT") -> "HOST:PORT" bound | nil, err. Raises for an address that is not HOST:PORT. */
int mn__core_listen(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  char host[256], err[300];
  int port;
  const char *addr = luaL_checkstring(L, 1);
  if (mn_parse_addr(addr, host, sizeof(host), &port) != 0) return luaL_argerror(L, 1, "want HOST:PORT");
  if (mn_join_listen(&c->join, &c->ctl, host, port, err, sizeof(err)) < 0) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  lua_pushstring(L, c->join.addr);
  return 1;
}

/*
 * core.joins() -> {{addr=, peer=} (joined) | {peer=, refused=, quiet=}, ...}, dropped refusals;
 * nothing at all when nothing happened (the script asks on every turn of its loop).
 */
int mn__core_joins(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  size_t n;
  uint64_t dropped;
  const mn_join_ev_t *e = mn_join_events(&c->join, &n, &dropped);
  if (n == 0 && dropped == 0) return 0;
  lua_createtable(L, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    lua_createtable(L, 0, 3);
    lua_pushstring(L, e[i].peer);
    lua_setfield(L, -2, "peer");
    lua_pushstring(L, e[i].ok ? e[i].addr : e[i].why);
    lua_setfield(L, -2, e[i].ok ? "addr" : "refused");
    lua_pushboolean(L, e[i].quiet);
    lua_setfield(L, -2, "quiet");
    lua_rawseti(L, -2, (int)i + 1);
  }
  mn_join_done(&c->join);
  lua_pushnumber(L, (lua_Number)dropped);
  return 2;
}
