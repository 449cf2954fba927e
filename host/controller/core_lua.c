/*
 * core_lua.c - the C<->Lua bridge: the `monarch.core` module.
 *
 * Lua owns futures and meshes; C owns sockets and bytes. Lua calls in to
 * queue calls (encoded here, once per call, whatever the number of
 * targets) and to drain completions (core_results.c); libuv callbacks never call Lua.
 * The controller state is one userdata kept in the registry under the
 * address of a static key.
 */
#include "clock.h"
#include "core_lua_int.h"
#include "path.h"
#include "sock.h"
#include "version.h"

#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
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

/* ---- Lua values <-> msgpack (luapack.c) --------------------------------------- */

/* Packs call argument `argn` (at idx); the CALL array and its argument array
 * take two of the frame's nesting levels. */
static void encode_named(lua_State *L, msgpack_packer *pk, int idx, int argn, const char *kernel) {
  char what[160];
  if (kernel != NULL) snprintf(what, sizeof(what), "call '%.100s': argument %d", kernel, argn);
  else snprintf(what, sizeof(what), "argument %d", argn);
  mn_pack_opts_t o = {MN_MAX_DEPTH - 2, what, "a proc"};
  mn_lua_pack(L, pk, idx, &o);
}

static void encode(lua_State *L, msgpack_packer *pk, int idx, int argn) { encode_named(L, pk, idx, argn, NULL); }

/* Raises msg as it is: a caller's mistake is named by what was wrong, not by a line of ours. */
static int raise_plain(lua_State *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  return lua_error(L);
}


/* ---- module functions ------------------------------------------------------- */

static int l_gc(lua_State *L) {
  lctl_t *c = lua_touserdata(L, 1);
  if (c->open) {
    c->open = 0;
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

/* core.start_agent(exe, token) -> port | nil, err */
static int l_start_agent(lua_State *L) {
  lctl_t *c = get_ctl(L);
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
static int l_connect(lua_State *L) {
  lctl_t *c = get_ctl(L);
  const char *kind = luaL_checkstring(L, 3);
  int id = mn_ctl_connect(&c->ctl, luaL_checkstring(L, 1), (int)luaL_checkinteger(L, 2),
                          strcmp(kind, "agent") == 0 ? MN_CONN_AGENT : MN_CONN_PROC);
  if (id < 0) return luaL_error(L, "cannot open a connection: %s", mn_strerror(id));
  lua_pushinteger(L, id);
  return 1;
}

/* core.connect_relayed(agent_conn, pid) -> id: a proc its agent reported with port 0, reached only through it. */
static int l_connect_relayed(lua_State *L) {
  lctl_t *c = get_ctl(L);
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
static int l_connect_pooled(lua_State *L) {
  lctl_t *c = get_ctl(L);
  int id = mn_ctl_connect_pooled(&c->ctl, luaL_checkstring(L, 1), (int)luaL_checkinteger(L, 2),
                                 (int)luaL_checkinteger(L, 3), (int64_t)luaL_checknumber(L, 4));
  if (id < 0) return luaL_error(L, "cannot open a connection: %s", mn_strerror(id));
  lua_pushinteger(L, id);
  return 1;
}

/* core.unlinked(conns) -> how many of these conns have no direct link up yet (each is then wanted). */
static int l_unlinked(lua_State *L) {
  lctl_t *c = get_ctl(L);
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

static int l_disconnect(lua_State *L) {
  lctl_t *c = get_ctl(L);
  mn_ctl_disconnect(&c->ctl, (int)luaL_checkinteger(L, 1), luaL_optstring(L, 2, "closed by the script"));
  return 0;
}

/* core.info(id) -> state, host, pid, reason, inflight, direct (a pooled proc: whether its link is up; else nil) */
static int l_info(lua_State *L) {
  lctl_t *c = get_ctl(L);
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

/* A connection that can take frames now (or, for calls, once it is back). */
static mn_conn_t *ready_conn(lua_State *L, lctl_t *c, int id, int or_reconnecting) {
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
static int l_send(lua_State *L) {
  lctl_t *c = get_ctl(L);
  mn_conn_t *k = ready_conn(L, c, (int)luaL_checkinteger(L, 1), 0);
  if (mn_ctl_relay_only(k))
    return luaL_error(L, "connection %d takes only calls: it is a proc reached through its host agent (SPAWNED with port 0, "
                         "a simulated proc), with no link of its own for a message", (int)lua_tointeger(L, 1));
  luaL_checktype(L, 2, LUA_TTABLE);
  check_message(L, 2);
  msgpack_packer pk;
  c->scratch.len = 0;
  msgpack_packer_init(&pk, &c->scratch, mn_buf_write_cb);
  size_t s = mn_frame_begin(&c->scratch);
  encode(L, &pk, 2, 1);
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
  mn_conn_t *k = ready_conn(L, c, (int)luaL_checkinteger(L, e + 1), 0);
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
static int l_spawn(lua_State *L) {
  lctl_t *c = get_ctl(L);
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
      encode(L, &pk, lua_gettop(L), 2);
      if (pass == 1) rc = mn_ctl_spawn_add(&c->ctl, k, req, c->scratch.data, c->scratch.len);
      lua_pop(L, 1);
    }
  /* Those gathered go even if one could not be. */
  if (mn_ctl_spawn_end(&c->ctl) != 0 || rc != 0) return luaL_error(L, "out of memory");
  return 0;
}

/* Encodes [CALL, seq=0, kernel, args from stack index `first`] into c->scratch. */
static void encode_call(lua_State *L, lctl_t *c, const char *kernel, size_t kl, int first) {
  int nargs = lua_gettop(L) - first + 1;
  if (nargs > MN_MAX_ARGS) raise_plain(L, "call '%s': %d arguments exceed MN_MAX_ARGS (%d)", kernel, nargs, MN_MAX_ARGS);
  msgpack_packer pk;
  mn_buf_t *b = &c->scratch;
  b->len = 0;
  size_t s = mn_msg_call_head(b, &pk, kernel, kl, (uint32_t)nargs);
  for (int i = 0; i < nargs; i++) encode_named(L, &pk, first + i, i + 1, kernel);
  mn_frame_end(b, s);
  if (b->len - MN_FRAME_HEADER > MN_MAX_FRAME)
    raise_plain(L, "call '%s': its %d bytes of arguments exceed MN_MAX_FRAME (%d)", kernel, (int)b->len, MN_MAX_FRAME);
}

/* core.check_call(kernel, ...): raises, as core.call would, for arguments that cannot be sent. */
static int l_check_call(lua_State *L) {
  size_t kl;
  const char *kernel = luaL_checklstring(L, 1, &kl);
  encode_call(L, get_ctl(L), kernel, kl, 2);
  return 0;
}

/* The test hook of core.test_fail_queue: whether this target is the one that fails for memory. */
static int hook_fails(lctl_t *c) { return c->fail_cast_in > 0 && --c->fail_cast_in == 0; }

/* core.test_fail_queue(n): the n-th call target queued from now fails as if out of memory (0: none). */
static int l_test_fail_queue(lua_State *L) {
  get_ctl(L)->fail_cast_in = (int)luaL_checkinteger(L, 1);
  return 0;
}

/* Whether the targets at stack index 2 are the kept list c->ids was read from, with the same epoch (*epoch:
 * the list's, -1 for none): at tens of thousands of procs, reading them again costs more than a cast. */
static int kept_ids(lua_State *L, lctl_t *c, size_t n, double *epoch) {
  lua_getfield(L, 2, "epoch");
  *epoch = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : -1;
  lua_pop(L, 1);
  if (*epoch < 0 || c->ids_ref == LUA_NOREF || c->ids_epoch != *epoch || c->ids_n != n) return 0;
  lua_rawgeti(L, LUA_REGISTRYINDEX, c->ids_ref);
  int same = lua_rawequal(L, -1, 2);
  lua_pop(L, 1);
  return same;
}

/* core.call's targets at stack index 2 (a number, or an array of numbers) into c->ids: read once, so
 * that the loop over them can fetch the procs ahead from a C array. Returns their count. */
static int target_ids(lua_State *L, lctl_t *c) {
  int single = lua_type(L, 2) == LUA_TNUMBER;
  size_t n = single ? 1 : lua_objlen(L, 2);
  double epoch = -1;
  if (!single && kept_ids(L, c, n, &epoch)) return (int)n;
  if (n > c->ids_cap) {
    int *ids = realloc(c->ids, n * sizeof(*ids));
    if (ids == NULL) luaL_error(L, "out of memory queueing a call");
    c->ids = ids;
    c->ids_cap = n;
  }
  luaL_unref(L, LUA_REGISTRYINDEX, c->ids_ref); /* ids is about to change */
  c->ids_ref = LUA_NOREF;
  if (single) c->ids[0] = (int)lua_tointeger(L, 2);
  for (size_t i = 0; !single && i < n; i++) {
    lua_rawgeti(L, 2, (int)i + 1);
    c->ids[i] = (int)lua_tointeger(L, -1);
    lua_pop(L, 1);
  }
  if (epoch >= 0) {
    lua_pushvalue(L, 2);
    c->ids_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    c->ids_epoch = epoch;
    c->ids_n = n;
  }
  return (int)n;
}

/* Pushes the slots of core.call that were not queued (skipped[0..nskip), an array, or nil). */
static void push_skipped(lua_State *L, const int *skipped, int nskip) {
  if (nskip == 0) {
    lua_pushnil(L);
    return;
  }
  lua_createtable(L, nskip, 0);
  for (int i = 0; i < nskip; i++) {
    lua_pushinteger(L, skipped[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

/*
 * core.call(call_id, targets, kernel, ...) -> depth, skipped, oom_from : queues [CALL, seq, kernel, args]
 * to each connection in targets (a number, or an array of numbers); slot i of the call is targets[i]. The
 * body is encoded once and copied per target. It raises only before anything is queued (arguments that
 * cannot be sent, a bad targets list); after that every slot is either queued or returned: `skipped`
 * lists the slots whose connection is no longer up (closed before Lua heard), `oom_from` is the first
 * slot not queued for lack of memory (every later one neither). The caller fails those slots.
 */
static int l_call(lua_State *L) {
  lctl_t *c = get_ctl(L);
  double call = luaL_checknumber(L, 1);
  size_t kl;
  const char *kernel = luaL_checklstring(L, 3, &kl);
  encode_call(L, c, kernel, kl, 4);
  mn_buf_t *b = &c->scratch;
  size_t deepest = 0;
  int n = target_ids(L, c), nskip = 0, oom_from = 0;
  int *ids = c->ids; /* a skipped target's entry is reused for its slot number: ids[0..nskip) */
  for (int i = 0; i < n; i++) {
    /* Thousands of procs are cold: each is fetched in stages ahead of its turn (mn_ctl_prefetch). */
    if (i + 8 < n) mn_ctl_prefetch(&c->ctl, (uint64_t)ids[i + 8], MN_PF_CONN);
    if (i + 4 < n) mn_ctl_prefetch(&c->ctl, (uint64_t)ids[i + 4], MN_PF_SEND);
    mn_conn_t *k = mn_ctl_conn(&c->ctl, ids[i]);
    mn_conn_state_t st = k != NULL ? mn_ctl_conn_state(k) : MN_CS_CLOSED;
    if (st != MN_CS_READY && st != MN_CS_RECONNECTING) {
      ids[nskip++] = i + 1;
      continue;
    }
    /* A mesh-wide call goes through the host agents, one frame per host (ctl_cast.c). */
    if (hook_fails(c) || mn_ctl_cast_add(&c->ctl, k, b->data, b->len, call, i + 1, n >= c->ctl.cast_min) != 0) {
      oom_from = i + 1;
      break;
    }
    if (mn_ctl_inflight(k) > deepest) deepest = mn_ctl_inflight(k);
  }
  /* What was gathered goes whatever came after it; the cast's state is clear for the next one. */
  if (mn_ctl_cast_end(&c->ctl, b->data, b->len) != 0 && oom_from == 0) oom_from = n + 1;
  if (nskip > 0 || oom_from > 0) { /* ids was overwritten: a kept list must be read again */
    luaL_unref(L, LUA_REGISTRYINDEX, c->ids_ref);
    c->ids_ref = LUA_NOREF;
  }
  /* The deepest queue among the targets: Lua holds back past its window. */
  lua_pushnumber(L, (lua_Number)deepest);
  push_skipped(L, ids, nskip);
  if (oom_from > 0) lua_pushinteger(L, oom_from);
  else lua_pushnil(L);
  return 3;
}

/* core.call_as(call_id, conn, slot, kernel, ...) -> depth, or nil and why: one target with an explicit
 * slot. Raises only for arguments that cannot be sent; a connection no longer up, or no memory, is
 * returned for the caller to fail the slot. */
static int l_call_as(lua_State *L) {
  lctl_t *c = get_ctl(L);
  double call = luaL_checknumber(L, 1);
  int id = (int)luaL_checkinteger(L, 2);
  int slot = (int)luaL_checkinteger(L, 3);
  size_t kl;
  const char *kernel = luaL_checklstring(L, 4, &kl);
  encode_call(L, c, kernel, kl, 5);
  mn_conn_t *k = mn_ctl_conn(&c->ctl, id);
  mn_conn_state_t st = k != NULL ? mn_ctl_conn_state(k) : MN_CS_CLOSED;
  const char *why = NULL;
  if (st != MN_CS_READY && st != MN_CS_RECONNECTING) why = "closed";
  else if (hook_fails(c) || mn_ctl_call(&c->ctl, k, c->scratch.data, c->scratch.len, call, slot) != 0)
    why = "memory";
  /* Clears the cast state whatever happened (a relay-only proc's call is gathered as a cast). */
  if (mn_ctl_cast_end(&c->ctl, c->scratch.data, c->scratch.len) != 0 && why == NULL) why = "memory";
  if (why != NULL) {
    lua_pushnil(L);
    lua_pushstring(L, why);
    return 2;
  }
  lua_pushnumber(L, (lua_Number)mn_ctl_inflight(k));
  return 1;
}

/* core.relay(proc_conn, agent_conn, pid): that agent relays casts to that proc (it spawned it as pid). */
static int l_relay(lua_State *L) {
  lctl_t *c = get_ctl(L);
  mn_conn_t *k = mn_ctl_conn(&c->ctl, (int)luaL_checkinteger(L, 1));
  if (k == NULL) return luaL_argerror(L, 1, "no such connection");
  mn_ctl_set_relay(&c->ctl, k, (int)luaL_checkinteger(L, 2), (int64_t)luaL_checknumber(L, 3));
  return 0;
}

/* core.relayed(conns) -> how many calls to these conns are in flight through their agents. */
static int l_relayed(lua_State *L) {
  lctl_t *c = get_ctl(L);
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

/* t[k] = v for the table on top of the stack. */
static void set_number(lua_State *L, const char *k, lua_Number v) {
  lua_pushnumber(L, v);
  lua_setfield(L, -2, k);
}

/* core.cast_stats() -> {casts = CAST frames sent, calls = the proc calls they carried, tree = whether casts
 * go through the tree, links_up = agents whose parent link is up, routed = agents cast to through their
 * parent, vouched = agents their parent watches (not PINGed), agent_pings = PINGs written to agents,
 * tree_agents = agents in the tree, cast_min, and the pool of direct links to pooled procs (ctl_pool.c):
 * direct_links = open or opening now, direct_max, direct_opened and direct_closed since the start,
 * conn_bytes = the connection table's memory outside malloc (huge-page blocks), resent = relayed calls
 * taken off the tree and resent (an agent lost, a link down, a rebuild),
 * direct_waiting = procs waiting for one, spawn_relayed = SPAWNs sent through a parent, spawn_resent = those
 * sent again directly (a relay on the way lost), links_wanted = the parent links the current tree has} */
static int l_cast_stats(lua_State *L) {
  lctl_t *c = get_ctl(L);
  int active, up, routed, vouched;
  mn_ctl_tree_stats(&c->ctl, &active, &up, &routed, &vouched);
  lua_createtable(L, 0, 20);
  set_number(L, "casts", (lua_Number)c->ctl.casts);
  set_number(L, "vouched", vouched);
  set_number(L, "agent_pings", (lua_Number)c->ctl.agent_pings);
  set_number(L, "calls", (lua_Number)c->ctl.cast_calls);
  lua_pushboolean(L, active);
  lua_setfield(L, -2, "tree");
  set_number(L, "links_up", up);
  set_number(L, "routed", routed);
  set_number(L, "tree_agents", c->ctl.ntree);
  set_number(L, "cast_min", c->ctl.cast_min);
  set_number(L, "direct_links", c->ctl.npool);
  set_number(L, "direct_max", c->ctl.direct_max);
  set_number(L, "conn_bytes", (lua_Number)c->ctl.slab_bytes);
  set_number(L, "resent", (lua_Number)c->ctl.tree_resent);
  set_number(L, "spawn_relayed", (lua_Number)c->ctl.spawn_relayed);
  set_number(L, "spawn_resent", (lua_Number)c->ctl.spawn_resent);
  set_number(L, "links_wanted", mn_ctl_tree_wanted(&c->ctl));
  set_number(L, "direct_opened", (lua_Number)c->ctl.pool_opened);
  set_number(L, "direct_closed", (lua_Number)c->ctl.pool_closed);
  set_number(L, "direct_waiting", c->ctl.nwaitq - c->ctl.waitq_at);
  return 1;
}

/* core.oldest(id) -> the call id of the oldest call in flight there (the one running), or nil */
static int l_oldest(lua_State *L) {
  lctl_t *c = get_ctl(L);
  mn_conn_t *k = mn_ctl_conn(&c->ctl, (int)luaL_checkinteger(L, 1));
  mn_pending_t p;
  if (k == NULL || mn_ctl_oldest(k, &p) != 0) return 0;
  lua_pushnumber(L, p.call);
  return 1;
}

/* core.take_pending(id) -> {call, slot, call, slot, ...} of calls never answered */
static int l_take_pending(lua_State *L) {
  lctl_t *c = get_ctl(L);
  mn_conn_t *k = mn_ctl_conn(&c->ctl, (int)luaL_checkinteger(L, 1));
  if (k == NULL) return luaL_argerror(L, 1, "no such connection");
  lua_createtable(L, (int)mn_ctl_inflight(k) * 2, 0);
  int n = 0;
  mn_pending_t p;
  while (mn_ctl_take_pending(k, &p)) {
    lua_pushnumber(L, p.call);
    lua_rawseti(L, -2, ++n);
    lua_pushinteger(L, p.slot);
    lua_rawseti(L, -2, ++n);
  }
  return 1;
}

/* core.inflight(id) -> calls sent to that connection and not yet answered */
static int l_inflight(lua_State *L) {
  lctl_t *c = get_ctl(L);
  mn_conn_t *k = mn_ctl_conn(&c->ctl, (int)luaL_checkinteger(L, 1));
  lua_pushnumber(L, k ? (lua_Number)mn_ctl_inflight(k) : 0);
  return 1;
}

/* core.cancel(id, call) -> how many of the call's requests in flight there were asked to stop */
static int l_cancel(lua_State *L) {
  lctl_t *c = get_ctl(L);
  mn_conn_t *k = mn_ctl_conn(&c->ctl, (int)luaL_checkinteger(L, 1));
  int n = k != NULL && mn_ctl_conn_kind(k) == MN_CONN_PROC ? mn_ctl_cancel(&c->ctl, k, luaL_checknumber(L, 2)) : 0;
  if (n < 0) return luaL_error(L, "core.cancel: %s", mn_strerror(n));
  lua_pushinteger(L, n);
  return 1;
}

/* core.tree_build() -> the parent links the tree has: rebuilds it now if the agents changed since (as the
 * next cast would), so that its links can come up before a spawn goes down it. */
static int l_tree_build(lua_State *L) {
  lctl_t *c = get_ctl(L);
  lua_pushinteger(L, mn_ctl_tree_build(&c->ctl));
  return 1;
}

/* core.configure's direct_max = n (most pooled links open at once) and direct_idle = s (an unused one closes). */
static int configure_pool(lua_State *L, lctl_t *c) {
  int max = 0;
  uint64_t idle = 0;
  lua_getfield(L, 1, "direct_max");
  if (!lua_isnil(L, -1)) {
    lua_Number n = luaL_checknumber(L, -1);
    if (n < 1 || n > MN_MAX_CONNS || n != (lua_Number)(int)n)
      return luaL_error(L, "core.configure: direct_max must be an integer in 1..%d", MN_MAX_CONNS);
    max = (int)n;
  }
  lua_pop(L, 1);
  lua_getfield(L, 1, "direct_idle");
  if (!lua_isnil(L, -1)) {
    double d = luaL_checknumber(L, -1);
    if (d <= 0 || d > 86400) return luaL_error(L, "core.configure: direct_idle must be in (0, 86400] seconds");
    idle = (uint64_t)(d * 1000 + 0.5);
    if (idle == 0) idle = 1;
  }
  lua_pop(L, 1);
  mn_ctl_pool_configure(&c->ctl, max, idle);
  return 0;
}

/* core.configure{heartbeat = s, heartbeat_timeout = s, reconnect = s, cast_min = n, fanout = k,
 * direct_max = n, direct_idle = s} */
static int l_configure(lua_State *L) {
  lctl_t *c = get_ctl(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  uint64_t v[3] = {0, 0, 0};
  static const char *const keys[3] = {"heartbeat", "heartbeat_timeout", "reconnect"};
  for (int i = 0; i < 3; i++) {
    lua_getfield(L, 1, keys[i]);
    if (!lua_isnil(L, -1)) {
      double d = luaL_checknumber(L, -1);
      if (d <= 0 || d > 86400) return luaL_error(L, "core.configure: %s must be in (0, 86400] seconds", keys[i]);
      v[i] = (uint64_t)(d * 1000 + 0.5);
      if (v[i] == 0) v[i] = 1;
    }
    lua_pop(L, 1);
  }
  mn_ctl_configure(&c->ctl, v[0], v[1], v[2]);
  lua_getfield(L, 1, "cast_min");
  if (!lua_isnil(L, -1)) {
    lua_Number n = luaL_checknumber(L, -1);
    if (n < 1 || n > 1e9 || n != (lua_Number)(int)n) return luaL_error(L, "core.configure: cast_min must be a positive integer");
    c->ctl.cast_min = (int)n;
  }
  lua_pop(L, 1);
  lua_getfield(L, 1, "fanout");
  if (!lua_isnil(L, -1)) {
    lua_Number n = luaL_checknumber(L, -1);
    if (!(n == 0 || (n >= 2 && n <= MN_TREE_MAX_FANOUT)) || n != (lua_Number)(int)n)
      return luaL_error(L, "core.configure: fanout must be 0 (no tree) or an integer in 2..%d", MN_TREE_MAX_FANOUT);
    c->ctl.fanout = (int)n;
    c->ctl.tree_dirty = 1; /* the next cast rebuilds the tree for it */
  }
  lua_pop(L, 1);
  return configure_pool(L, c);
}

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

/* ---- bulk transfer ---------------------------------------------------------- */

#define MN_PUT_ROOM 64 /* a chunk leaves this much of MN_MAX_FRAME for its CALL head (MN_MSG_PUT_HEAD) */

/*
 * core.put_chunk(call_id, targets, tensor_id, offset, src, src_off, len [, owner]) -> deepest
 * Queues [CALL, seq, "__tensor_put", [tensor_id, offset, bin]] to every
 * target, the bin written straight from src (a string, or an address given
 * as a number whose memory `owner` keeps alive) with no copy.
 */
static int l_put_chunk(lua_State *L) {
  lctl_t *c = get_ctl(L);
  double call = luaL_checknumber(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  uint64_t id = (uint64_t)luaL_checknumber(L, 3), off = (uint64_t)luaL_checknumber(L, 4);
  size_t soff = (size_t)luaL_checknumber(L, 6), len = (size_t)luaL_checknumber(L, 7), slen;
  const char *src;
  int keep;
  if (lua_type(L, 5) == LUA_TSTRING) {
    src = lua_tolstring(L, 5, &slen);
    if (soff + len > slen) return luaL_argerror(L, 7, "range runs past the end of the string");
    keep = 5;
  } else {
    src = (const char *)(uintptr_t)luaL_checknumber(L, 5);
    keep = 8;
    luaL_checkany(L, 8);
  }
  if (len > MN_MAX_FRAME - MN_PUT_ROOM) return luaL_argerror(L, 7, "chunk larger than MN_MAX_FRAME");
  char head[MN_MSG_PUT_HEAD];
  size_t h = mn_msg_put_head(head, id, off, (uint32_t)len);
  size_t deepest = 0;
  int n = (int)lua_objlen(L, 2);
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, 2, i);
    int conn = (int)lua_tointeger(L, -1);
    mn_conn_t *k = ready_conn(L, c, conn, 0);
    lua_pop(L, 1);
    lua_pushvalue(L, keep);
    int ref = luaL_ref(L, LUA_REGISTRYINDEX);
    int rc = mn_ctl_call_bulk(&c->ctl, k, head, h, src + soff, len, ref, call, i);
    if (rc == MN_EAGAIN) return luaL_error(L, "a bulk put on connection %d would overtake calls still going through its host agent (core.relayed)", conn);
    if (rc == MN_EINVAL) return luaL_error(L, "a bulk put needs a proc's own link; connection %d is a proc reached only through its host agent (port 0: a simulated proc)", conn);
    if (rc == MN_ECLOSED && mn_ctl_conn_state(k) == MN_CS_READY)
      return luaL_error(L, "a bulk put on connection %d needs its direct link, not open yet (core.unlinked waits for it)", conn);
    if (rc != 0) return luaL_error(L, "cannot queue a bulk put on connection %d", conn);
    if (mn_ctl_inflight(k) > deepest) deepest = mn_ctl_inflight(k);
  }
  lua_pushnumber(L, (lua_Number)deepest);
  return 1;
}

/* core.fetch_into(call_id, slot, address, capacity): that call's bytes land at address. */
static int l_fetch_into(lua_State *L) {
  lctl_t *c = get_ctl(L);
  if (c->ndests == c->dcap) {
    size_t cap = c->dcap ? c->dcap * 2 : 64;
    mn_dest_t *d = realloc(c->dests, cap * sizeof(*d));
    if (d == NULL) return luaL_error(L, "out of memory");
    c->dests = d;
    c->dcap = cap;
  }
  c->dests[c->ndests++] = (mn_dest_t){luaL_checknumber(L, 1), (int32_t)luaL_checkinteger(L, 2),
                                      (char *)(uintptr_t)luaL_checknumber(L, 3), (size_t)luaL_checknumber(L, 4)};
  return 0;
}

/* ---- same-host bulk: procs copy our memory themselves (host/proc/bulk.c) ------- */

static uint64_t bulk_cookie; /* random; a process that reads it at &bulk_cookie is on our kernel and may copy us */

/*
 * core.bulk_self() -> pid, cookie address, cookie: how a proc on this host
 * names and proves this process (__bulk_probe, __bulk_put, __bulk_fetch).
 * Under Yama's ptrace_scope 1 it also lets our descendants (the embedded
 * agent's procs) read and write our memory; nothing else is allowed more.
 */
static int l_bulk_self(lua_State *L) {
  if (bulk_cookie == 0) {
    if (sodium_init() < 0) return luaL_error(L, "cannot initialize libsodium");
    uint64_t r;
    randombytes_buf(&r, sizeof(r));
    bulk_cookie = (r & ((1ull << 52) - 1)) | 1; /* 52 bits: exact as a Lua number, never 0 */
#ifdef PR_SET_PTRACER
    if (prctl(PR_SET_PTRACER, (unsigned long)getpid(), 0, 0, 0) != 0 && errno != EINVAL) {
      /* EINVAL: no Yama; any other failure leaves the procs' probes to say no. */
    }
#endif
  }
  lua_pushnumber(L, (lua_Number)getpid());
  lua_pushnumber(L, (lua_Number)(uintptr_t)&bulk_cookie);
  lua_pushnumber(L, (lua_Number)bulk_cookie);
  return 3;
}

/*
 * core.hold(call_id, slot, conn, obj): keeps obj (the memory a __bulk_ call
 * copies) alive until that call's RESULT arrives, or, if conn closes first,
 * until its process is gone. core.holds() -> how many are held.
 */
static int l_hold(lua_State *L) {
  lctl_t *c = get_ctl(L);
  double call = luaL_checknumber(L, 1);
  int32_t slot = (int32_t)luaL_checkinteger(L, 2);
  int conn = (int)luaL_checkinteger(L, 3);
  luaL_checkany(L, 4);
  mn_conn_info_t i;
  if (mn_ctl_info(&c->ctl, conn, &i) != 0) return luaL_argerror(L, 3, "no such connection");
  if (c->nholds == c->hcap) {
    size_t cap = c->hcap ? c->hcap * 2 : 64;
    mn_hold_t *h = realloc(c->holds, cap * sizeof(*h));
    if (h == NULL) return luaL_error(L, "out of memory");
    c->holds = h;
    c->hcap = cap;
  }
  lua_pushvalue(L, 4);
  c->holds[c->nholds++] = (mn_hold_t){call, slot, conn, (int64_t)i.pid, luaL_ref(L, LUA_REGISTRYINDEX)};
  return 0;
}

static int l_holds(lua_State *L) {
  lua_pushnumber(L, (lua_Number)get_ctl(L)->nholds);
  return 1;
}

/* ---- the join port (ctl_join.c) ------------------------------------------------ */

/* core.listen("HOST:PORT") -> "HOST:PORT" bound | nil, err. Raises for an address that is not HOST:PORT. */
static int l_listen(lua_State *L) {
  lctl_t *c = get_ctl(L);
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
static int l_joins(lua_State *L) {
  lctl_t *c = get_ctl(L);
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

static void set_msg_type(void *data, int type, const char *name) {
  lua_State *L = data;
  lua_pushinteger(L, type);
  lua_setfield(L, -2, name);
}

int luaopen_monarch_core(lua_State *L) {
  static const luaL_Reg fns[] = {
      {"init", l_init},           {"shutdown", l_shutdown},   {"start_agent", l_start_agent},
      {"connect", l_connect},     {"connect_relayed", l_connect_relayed}, {"connect_pooled", l_connect_pooled}, {"unlinked", l_unlinked}, {"disconnect", l_disconnect}, {"info", l_info},
      {"send", l_send},           {"spawn", l_spawn}, {"tree_build", l_tree_build}, {"call", l_call},           {"call_as", l_call_as}, {"check_call", l_check_call}, {"test_fail_queue", l_test_fail_queue}, {"put_chunk", l_put_chunk}, {"fetch_into", l_fetch_into},           {"poll", mn__core_poll},
      {"take_pending", l_take_pending}, {"inflight", l_inflight}, {"cancel", l_cancel}, {"oldest", l_oldest},
      {"relay", l_relay}, {"relayed", l_relayed}, {"cast_stats", l_cast_stats}, {"collect", mn__core_collect},
      {"uncollect", mn__core_uncollect},
      {"configure", l_configure},         {"now", l_now},             {"generate_token", l_generate_token},
      {"prefix", l_prefix},       {"sleep", l_sleep},         {"catch_interrupts", l_catch_interrupts},
      {"interrupted", l_interrupted}, {"bulk_self", l_bulk_self}, {"hold", l_hold}, {"holds", l_holds},
      {"listen", l_listen}, {"joins", l_joins},
      {NULL, NULL}};
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
