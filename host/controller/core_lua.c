/*
 * core_lua.c - the C<->Lua bridge: the `monarch.core` module, its state and
 * its registration table.
 *
 * Lua owns futures and meshes; C owns sockets and bytes. Lua calls in to
 * queue calls (core_call.c: encoded once per call, whatever the number of
 * targets) and to drain completions (core_results.c); libuv callbacks never
 * call Lua. The controller state is one userdata kept in the registry under
 * the address of a static key; core.init makes it, core.shutdown (or the
 * state's collection) closes it. The module's other functions live by
 * topic: core_conn.c (connections), core_call.c (calls), core_bulk.c
 * (bulk), core_join.c (the join port), core_ship.c (shipping), core_config.c (settings, counters).
 */
#include "auth.h"
#include "clock.h"
#include "core_lua_int.h"
#include "path.h"
#include "version.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char ctl_key;
static lctl_t *get_ctl(lua_State *L) {
  lua_pushlightuserdata(L, &ctl_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lctl_t *c = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (c == NULL || !c->open) luaL_error(L, "monarch.core is not initialized (call core.init first)");
  return c;
}

/* ---- the state -------------------------------------------------------------- */

static int l_gc(lua_State *L) {
  lctl_t *c = lua_touserdata(L, 1);
  if (c->open) {
    c->open = 0;
    if (c->before_close != NULL) c->before_close(c->before_close_data); /* its handles close with the loop */
    mn_join_close(&c->join); /* before the loop's last turns, which run its close callbacks */
    mn_ctl_close(&c->ctl);
    mn_buf_free(&c->scratch);
    msgpack_zone_destroy(&c->zone);
    free(c->dests);
    free(c->holds); /* their references go with the Lua state */
    free(c->ids);
  }
  return 0;
}

lctl_t *mn__core_ctl(lua_State *L) { return get_ctl(L); }

/*
 * The controller's loop, for handles of monarch-run's own (the Jupyter
 * kernel's sockets, host/cli/jupyter_lua.c) that wake the same waits; NULL
 * before core.init and after core.shutdown. fn(data) runs once before that
 * loop closes, to close them; a second call replaces the first's fn.
 */
uv_loop_t *mn_lua_loop(lua_State *L, void (*fn)(void *data), void *data) {
  lua_pushlightuserdata(L, &ctl_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lctl_t *c = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (c == NULL || !c->open) return NULL;
  c->before_close = fn;
  c->before_close_data = data;
  return &c->ctl.loop;
}

/* core.init(token) */
static int l_init(lua_State *L) {
  size_t tl;
  const char *tok = luaL_checklstring(L, 1, &tl);
  lua_pushlightuserdata(L, &ctl_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lctl_t *old = lua_touserdata(L, -1);
  lua_pop(L, 1);
  if (old != NULL && old->open) return luaL_error(L, "monarch.core is already initialized");
  lctl_t *c = lua_newuserdata(L, sizeof(*c));
  memset(c, 0, sizeof(*c));
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, l_gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  if (mn_ctl_init(&c->ctl, tok, tl) != 0) return luaL_error(L, "cannot initialize the controller");
  msgpack_zone_init(&c->zone, 64 * 1024);
  for (int i = 0; i < MN_COLLECT_SLOTS; i++) c->collect[i].ref = LUA_NOREF;
  c->ids_ref = LUA_NOREF;
  c->open = 1;
  lua_pushlightuserdata(L, &ctl_key);
  lua_pushvalue(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);
  return 0;
}

static int l_shutdown(lua_State *L) {
  lua_pushlightuserdata(L, &ctl_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (lua_touserdata(L, -1) != NULL) {
    lua_pushcfunction(L, l_gc);
    lua_pushvalue(L, -2);
    lua_call(L, 1, 0);
  }
  return 0;
}

/* ---- the process: clock, token, prefix ------------------------------------------ */

static int l_now(lua_State *L) {
  lua_pushnumber(L, (lua_Number)mn_now_s());
  return 1;
}

static int l_generate_token(lua_State *L) {
  char tok[49];
  mn_auth_generate(tok, 48);
  lua_pushstring(L, tok);
  return 1;
}

/* core.prefix() -> install prefix of this build */
static int l_prefix(lua_State *L) {
  char p[4096];
  if (mn_prefix((const void *)l_prefix, p, sizeof(p)) != 0) return 0;
  lua_pushstring(L, p);
  return 1;
}

/* ---- Ctrl-C, for the REPL ------------------------------------------------------ */

static volatile sig_atomic_t interrupted; /* set by SIGINT while catch_interrupts is on */

static void on_sigint(int sig) { interrupted = 1; }

/* Returns whether Ctrl-C was pressed since the last call that cleared it; clears it if `clear`. */
int mn_lua_interrupted(int clear) {
  int was = interrupted != 0;
  if (clear) interrupted = 0;
  return was;
}

/* core.catch_interrupts(on): SIGINT sets a flag (checked by the REPL's waits) instead of ending the process. */
static int l_catch_interrupts(lua_State *L) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = lua_toboolean(L, 1) ? on_sigint : SIG_DFL;
  sa.sa_flags = 0; /* no SA_RESTART: a blocking read or poll returns EINTR at once */
  interrupted = 0;
  if (sigaction(SIGINT, &sa, NULL) != 0) return luaL_error(L, "cannot install the SIGINT handler");
  return 0;
}

/* core.interrupted([keep]) -> true once after each Ctrl-C (with keep, the flag stays set). */
static int l_interrupted(lua_State *L) {
  lua_pushboolean(L, mn_lua_interrupted(!lua_toboolean(L, 1)));
  return 1;
}

static int l_sleep(lua_State *L) {
  double s = luaL_checknumber(L, 1);
  if (s > 0) usleep((useconds_t)(s * 1e6));
  return 0;
}

static void set_msg_type(void *data, int type, const char *name) {
  lua_State *L = data;
  lua_pushinteger(L, type);
  lua_setfield(L, -2, name);
}

int luaopen_monarch_core(lua_State *L) {
  static const luaL_Reg fns[] = {
      /* the state and the process (here) */
      {"init", l_init}, {"shutdown", l_shutdown}, {"now", l_now}, {"generate_token", l_generate_token},
      {"prefix", l_prefix}, {"sleep", l_sleep}, {"catch_interrupts", l_catch_interrupts},
      {"interrupted", l_interrupted},
      /* connections (core_conn.c) */
      {"start_agent", mn__core_start_agent}, {"connect", mn__core_connect},
      {"connect_relayed", mn__core_connect_relayed}, {"connect_pooled", mn__core_connect_pooled},
      {"unlinked", mn__core_unlinked}, {"disconnect", mn__core_disconnect}, {"info", mn__core_info},
      {"relay", mn__core_relay}, {"relayed", mn__core_relayed}, {"send", mn__core_send},
      {"spawn", mn__core_spawn}, {"tree_build", mn__core_tree_build},
      /* calls (core_call.c) and their answers (core_results.c) */
      {"check_call", mn__core_check_call}, {"test_fail_queue", mn__core_test_fail_queue},
      {"call", mn__core_call}, {"call_as", mn__core_call_as}, {"oldest", mn__core_oldest},
      {"take_pending", mn__core_take_pending}, {"inflight", mn__core_inflight}, {"cancel", mn__core_cancel},
      {"poll", mn__core_poll}, {"collect", mn__core_collect}, {"uncollect", mn__core_uncollect},
      /* bulk (core_bulk.c) */
      {"put_chunk", mn__core_put_chunk}, {"fetch_into", mn__core_fetch_into}, {"bulk_self", mn__core_bulk_self},
      {"hold", mn__core_hold}, {"holds", mn__core_holds},
      /* shipping files to the hosts (core_ship.c) */
      {"ship_hash", mn__core_ship_hash}, {"ship_read", mn__core_ship_read}, {"ship_elf", mn__core_ship_elf}, {"ship_ask", mn__core_ship_ask},
      {"ship_send", mn__core_ship_send}, {"ship_stats", mn__core_ship_stats}, {"listdir", mn__core_listdir},
      {"stat", mn__core_stat},
      /* the join port (core_join.c) */
      {"listen", mn__core_listen}, {"joins", mn__core_joins},
      /* settings and counters (core_config.c) */
      {"cast_stats", mn__core_cast_stats}, {"configure", mn__core_configure},
      {NULL, NULL}};
  /* Before any libsodium call: it picks its fastest code for this CPU then (BLAKE2b: 1.6x the portable one). */
  if (mn_auth_global_init() != 0) return luaL_error(L, "libsodium cannot start");
  lua_createtable(L, 0, 20);
  luaL_register(L, NULL, fns);
  lua_pushinteger(L, MN_PROTOCOL_VERSION);
  lua_setfield(L, -2, "protocol_version");
  lua_pushstring(L, MN_VERSION);
  lua_setfield(L, -2, "version");
  lua_pushinteger(L, MN_MAX_ARGS);
  lua_setfield(L, -2, "max_args");
  lua_newtable(L); /* stack: core, MSG */
  mn_msg_each(set_msg_type, L);
  lua_setfield(L, -2, "MSG");
  return 1;
}
