/*
 * core_conn.c - monarch.core's connections: starting the embedded agent,
 * opening agent, proc, pooled and relay-only connections, what each is
 * now (core.info), and the messages a script sends on one: core.send and
 * core.spawn (SPAWNs down the cast tree, ctl_spawn.c).
 */
#include "core_lua_int.h"

#include <math.h>
#include <string.h>

/* core.start_agent(exe, token) -> port | nil, err */
int mn__core_start_agent(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  char err[512];
  int port = mn_ctl_start_agent(&c->ctl, luaL_checkstring(L, 1), luaL_checkstring(L, 2), err, sizeof(err));
  if (port < 0) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    return 2;
  }
  lua_pushinteger(L, port);
  lua_pushinteger(L, mn_ctl_agent_pid(&c->ctl));
  return 2;
}

/* core.connect(host, port, "agent"|"proc") -> id */
int mn__core_connect(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  const char *kind = luaL_checkstring(L, 3);
  int id = mn_ctl_connect(&c->ctl, luaL_checkstring(L, 1), (int)luaL_checkinteger(L, 2),
                          strcmp(kind, "agent") == 0 ? MN_CONN_AGENT : MN_CONN_PROC);
  if (id < 0) return luaL_error(L, "cannot open a connection: %s", mn_strerror(id));
  lua_pushinteger(L, id);
  return 1;
}

/* core.connect_relayed(agent_conn, pid) -> id: a proc its agent reported with port 0, reached only through it. */
int mn__core_connect_relayed(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  int agent = (int)luaL_checkinteger(L, 1);
  int id = mn_ctl_connect_relayed(&c->ctl, agent, (int64_t)luaL_checknumber(L, 2));
  if (id == MN_EINVAL) return luaL_argerror(L, 1, "not a ready host agent connection");
  if (id < 0) return luaL_error(L, "cannot open a relay-only connection: %s", mn_strerror(id));
  lua_pushinteger(L, id);
  return 1;
}

/* core.connect_pooled(host, port, agent_conn, pid) -> id: a proc of a large mesh, its link one of a capped
 * pool (ctl_pool.c): "connected" once its first link carried its SESSION, then reached through its agent
 * but for what a direct link pays for. */
int mn__core_connect_pooled(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  int id = mn_ctl_connect_pooled(&c->ctl, luaL_checkstring(L, 1), (int)luaL_checkinteger(L, 2),
                                 (int)luaL_checkinteger(L, 3), (int64_t)luaL_checknumber(L, 4));
  if (id < 0) return luaL_error(L, "cannot open a connection: %s", mn_strerror(id));
  lua_pushinteger(L, id);
  return 1;
}

/* core.unlinked(conns) -> how many of these conns have no direct link up yet (each is then wanted). */
int mn__core_unlinked(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  int missing = 0;
  for (int i = 1, n = (int)lua_objlen(L, 1); i <= n; i++) {
    lua_rawgeti(L, 1, i);
    mn_conn_t *k = mn_ctl_conn(&c->ctl, (int)lua_tointeger(L, -1));
    lua_pop(L, 1);
    if (k != NULL && !mn_ctl_pool_linked(&c->ctl, k)) missing++;
  }
  lua_pushinteger(L, missing);
  return 1;
}

int mn__core_disconnect(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  mn_ctl_disconnect(&c->ctl, (int)luaL_checkinteger(L, 1), luaL_optstring(L, 2, "closed by the script"));
  return 0;
}

/* core.info(id) -> state, host, pid, reason, inflight, direct (a pooled proc: whether its link is up; else nil) */
int mn__core_info(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  mn_conn_info_t i;
  if (mn_ctl_info(&c->ctl, (int)luaL_checkinteger(L, 1), &i) != 0) return luaL_argerror(L, 1, "no such connection");
  lua_pushstring(L, i.state_name);
  lua_pushstring(L, i.host);
  lua_pushnumber(L, (lua_Number)i.pid);
  lua_pushstring(L, i.reason);
  lua_pushnumber(L, (lua_Number)i.inflight);
  if (i.direct < 0) lua_pushnil(L);
  else lua_pushboolean(L, i.direct);
  return 6;
}

/* core.relay(proc_conn, agent_conn, pid): that agent relays casts to that proc (it spawned it as pid). */
int mn__core_relay(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  mn_conn_t *k = mn_ctl_conn(&c->ctl, (int)luaL_checkinteger(L, 1));
  if (k == NULL) return luaL_argerror(L, 1, "no such connection");
  mn_ctl_set_relay(&c->ctl, k, (int)luaL_checkinteger(L, 2), (int64_t)luaL_checknumber(L, 3));
  return 0;
}

/* core.relayed(conns) -> how many calls to these conns are in flight through their agents. */
int mn__core_relayed(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  size_t total = 0;
  for (int i = 1, n = (int)lua_objlen(L, 1); i <= n; i++) {
    lua_rawgeti(L, 1, i);
    mn_conn_t *k = mn_ctl_conn(&c->ctl, (int)lua_tointeger(L, -1));
    lua_pop(L, 1);
    if (k != NULL) total += mn_ctl_relayed(k);
  }
  lua_pushnumber(L, (lua_Number)total);
  return 1;
}

/* A connection that can take frames now (or, for calls, once it is back). */
mn_conn_t *mn__core_ready_conn(lua_State *L, lctl_t *c, int id, int or_reconnecting) {
  mn_conn_t *k = mn_ctl_conn(&c->ctl, id);
  if (k == NULL) luaL_error(L, "no connection %d", id);
  mn_conn_state_t st = mn_ctl_conn_state(k);
  if (st != MN_CS_READY && !(or_reconnecting && st == MN_CS_RECONNECTING)) {
    mn_conn_info_t i;
    mn_ctl_info(&c->ctl, id, &i); /* k exists: cannot fail */
    luaL_error(L, "connection %d is not ready (%s: %s)", id, i.state_name, i.reason);
  }
  return k;
}

/* Raises unless the table at idx is {type, ...} of a type a script may send, with its element count. */
static void check_message(lua_State *L, int idx) {
  char err[200];
  size_t n = lua_objlen(L, idx), count = 0;
  lua_pushnil(L);
  while (lua_next(L, idx) != 0) {
    count++;
    lua_pop(L, 1);
  }
  lua_rawgeti(L, idx, 1);
  int typed = lua_type(L, -1) == LUA_TNUMBER;
  lua_Number t = lua_tonumber(L, -1);
  lua_pop(L, 1);
  /* Keys exactly 1..n, as luapack packs an array; anything else would go as a map. */
  if (count != n || n == 0 || !typed || t != floor(t))
    luaL_argerror(L, idx, "a message is an array {MSG.X, field...} starting with its type");
  if (mn_msg_check_script_send((int64_t)t, n, err, sizeof(err)) != 0) luaL_argerror(L, idx, err);
}

/* core.send(id, array) : a whole message, e.g. {MSG.SPAWN, req, spec} */
int mn__core_send(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  mn_conn_t *k = mn__core_ready_conn(L, c, (int)luaL_checkinteger(L, 1), 0);
  if (mn_ctl_relay_only(k))
    return luaL_error(L, "connection %d takes only calls: it is a proc reached through its host agent (SPAWNED with port 0, "
                         "a simulated proc), with no link of its own for a message", (int)lua_tointeger(L, 1));
  luaL_checktype(L, 2, LUA_TTABLE);
  check_message(L, 2);
  msgpack_packer pk;
  c->scratch.len = 0;
  msgpack_packer_init(&pk, &c->scratch, mn_buf_write_cb);
  size_t s = mn_frame_begin(&c->scratch);
  mn__core_encode(L, &pk, 2, 1, NULL);
  mn_frame_end(&c->scratch, s);
  if (mn_ctl_send(&c->ctl, k, c->scratch.data, c->scratch.len) != 0) return luaL_error(L, "out of memory");
  return 0;
}

/* Entry i of core.spawn's list (at stack index 1): its agent conn, req and, on top of the stack, its spec. */
static mn_conn_t *spawn_entry(lua_State *L, lctl_t *c, int i, uint64_t *req) {
  lua_rawgeti(L, 1, i);
  int e = lua_gettop(L);
  if (!lua_istable(L, e)) luaL_error(L, "core.spawn: entry %d is not a {conn, req, spec} table", i);
  lua_rawgeti(L, e, 1);
  lua_rawgeti(L, e, 2);
  lua_rawgeti(L, e, 3);
  mn_conn_t *k = mn__core_ready_conn(L, c, (int)luaL_checkinteger(L, e + 1), 0);
  lua_Number r = luaL_checknumber(L, e + 2);
  if (mn_ctl_conn_kind(k) != MN_CONN_AGENT || r < 1 || r != floor(r) || !lua_istable(L, e + 3))
    luaL_error(L, "core.spawn: entry %d wants {agent conn, req (a positive integer), spec table}", i);
  *req = (uint64_t)r;
  lua_replace(L, e);
  lua_settop(L, e);
  return k;
}

/* core.spawn(list): list[i] = {agent conn, req, spec}, one SPAWN each, sent down the cast
 * tree where it is up (an agent hands its children theirs); each agent answers on its own connection
 * (ctl_spawn.c). Every entry is checked before any is sent. */
int mn__core_spawn(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  int n = (int)lua_objlen(L, 1), rc = 0;
  /* Pass 0 checks (a spec that cannot be packed raises here), pass 1 gathers and sends. */
  for (int pass = 0; pass < 2; pass++)
    for (int i = 1; i <= n && rc == 0; i++) {
      uint64_t req;
      mn_conn_t *k = spawn_entry(L, c, i, &req);
      msgpack_packer pk;
      c->scratch.len = 0;
      msgpack_packer_init(&pk, &c->scratch, mn_buf_write_cb);
      msgpack_pack_uint64(&pk, req);
      mn__core_encode(L, &pk, lua_gettop(L), 2, NULL);
      if (pass == 1) rc = mn_ctl_spawn_add(&c->ctl, k, req, c->scratch.data, c->scratch.len);
      lua_pop(L, 1);
    }
  /* Those gathered go even if one could not be. */
  if (mn_ctl_spawn_end(&c->ctl) != 0 || rc != 0) return luaL_error(L, "out of memory");
  return 0;
}

/* core.tree_build() -> the parent links the tree has: rebuilds it now if the agents changed since (as the
 * next cast would), so that its links can come up before a spawn goes down it. */
int mn__core_tree_build(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  lua_pushinteger(L, mn_ctl_tree_build(&c->ctl));
  return 1;
}
