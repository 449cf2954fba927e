/*
 * core_call.c - monarch.core's calls: core.call encodes a call once for every
 * target and queues it (through the agents, ctl_cast.c), core.call_as one
 * target with its slot, and what a connection has in flight (core.inflight,
 * core.oldest, core.take_pending, core.cancel). Their answers come back
 * through core_results.c.
 */
#include "core_lua_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* Packs call argument `argn` (at idx); the CALL array and its argument array
 * take two of the frame's nesting levels. */
void mn__core_encode(lua_State *L, msgpack_packer *pk, int idx, int argn, const char *kernel) {
  char what[160];
  if (kernel != NULL) snprintf(what, sizeof(what), "call '%.100s': argument %d", kernel, argn);
  else snprintf(what, sizeof(what), "argument %d", argn);
  mn_pack_opts_t o = {MN_MAX_DEPTH - 2, what, "a proc"};
  mn_lua_pack(L, pk, idx, &o);
}

/* Raises msg as it is: a caller's mistake is named by what was wrong, not by a line of ours. */
static int raise_plain(lua_State *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  return lua_error(L);
}

/* Encodes [CALL, seq=0, kernel, args from stack index `first`] into c->scratch. */
static void encode_call(lua_State *L, lctl_t *c, const char *kernel, size_t kl, int first) {
  int nargs = lua_gettop(L) - first + 1;
  if (nargs > MN_MAX_ARGS) raise_plain(L, "call '%s': %d arguments exceed MN_MAX_ARGS (%d)", kernel, nargs, MN_MAX_ARGS);
  msgpack_packer pk;
  mn_buf_t *b = &c->scratch;
  b->len = 0;
  size_t s = mn_msg_call_head(b, &pk, kernel, kl, (uint32_t)nargs);
  for (int i = 0; i < nargs; i++) mn__core_encode(L, &pk, first + i, i + 1, kernel);
  mn_frame_end(b, s);
  if (b->len - MN_FRAME_HEADER > MN_MAX_FRAME)
    raise_plain(L, "call '%s': its %d bytes of arguments exceed MN_MAX_FRAME (%d)", kernel, (int)b->len, MN_MAX_FRAME);
}

/* core.check_call(kernel, ...): raises, as core.call would, for arguments that cannot be sent. */
int mn__core_check_call(lua_State *L) {
  size_t kl;
  const char *kernel = luaL_checklstring(L, 1, &kl);
  encode_call(L, mn__core_ctl(L), kernel, kl, 2);
  return 0;
}

/* The test hook of core.test_fail_queue: whether this target is the one that fails for memory. */
static int hook_fails(lctl_t *c) { return c->fail_cast_in > 0 && --c->fail_cast_in == 0; }

/* core.test_fail_queue(n): the n-th call target queued from now fails as if out of memory (0: none). */
int mn__core_test_fail_queue(lua_State *L) {
  mn__core_ctl(L)->fail_cast_in = (int)luaL_checkinteger(L, 1);
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
 * lists the slots whose connection is closed (before Lua heard; one between links, reconnecting or in a
 * redial's handshake, is queued for its return), `oom_from` is the first slot not queued for lack of
 * memory (every later one neither). The caller fails those slots.
 */
int mn__core_call(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
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
    if (st == MN_CS_CLOSED) {
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
  /* What was gathered goes whatever came after it; the cast's state is clear for the next one. A CAST
   * that finds no memory to be packed leaves its calls in flight on their procs unsent: which slots
   * those are is not known here (see docs/architecture.md, the transaction). */
  (void)mn_ctl_cast_end(&c->ctl, b->data, b->len);
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
 * slot. Raises only for arguments that cannot be sent; a connection closed, or no memory, is
 * returned for the caller to fail the slot. */
int mn__core_call_as(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  double call = luaL_checknumber(L, 1);
  int id = (int)luaL_checkinteger(L, 2);
  int slot = (int)luaL_checkinteger(L, 3);
  size_t kl;
  const char *kernel = luaL_checklstring(L, 4, &kl);
  encode_call(L, c, kernel, kl, 5);
  mn_conn_t *k = mn_ctl_conn(&c->ctl, id);
  mn_conn_state_t st = k != NULL ? mn_ctl_conn_state(k) : MN_CS_CLOSED;
  const char *why = NULL;
  if (st == MN_CS_CLOSED) why = "closed";
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

/* core.oldest(id) -> the call id of the oldest call in flight there (the one running), or nil */
int mn__core_oldest(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  mn_conn_t *k = mn_ctl_conn(&c->ctl, (int)luaL_checkinteger(L, 1));
  mn_pending_t p;
  if (k == NULL || mn_ctl_oldest(k, &p) != 0) return 0;
  lua_pushnumber(L, p.call);
  return 1;
}

/* core.take_pending(id) -> {call, slot, call, slot, ...} of calls never answered */
int mn__core_take_pending(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
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
int mn__core_inflight(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  mn_conn_t *k = mn_ctl_conn(&c->ctl, (int)luaL_checkinteger(L, 1));
  lua_pushnumber(L, k ? (lua_Number)mn_ctl_inflight(k) : 0);
  return 1;
}

/* core.cancel(id, call) -> how many of the call's requests in flight there were asked to stop */
int mn__core_cancel(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
  mn_conn_t *k = mn_ctl_conn(&c->ctl, (int)luaL_checkinteger(L, 1));
  int n = k != NULL && mn_ctl_conn_kind(k) == MN_CONN_PROC ? mn_ctl_cancel(&c->ctl, k, luaL_checknumber(L, 2)) : 0;
  if (n < 0) return luaL_error(L, "core.cancel: %s", mn_strerror(n));
  lua_pushinteger(L, n);
  return 1;
}
