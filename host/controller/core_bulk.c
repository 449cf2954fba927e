/*
 * core_bulk.c - monarch.core's bulk transfer: puts written straight from the
 * script's memory (core.put_chunk), fetches landing in it (core.fetch_into),
 * and same-host bulk, where procs copy our memory themselves
 * (core.bulk_self, core.hold; host/proc/bulk.c).
 */
#include "core_lua_int.h"

#include <errno.h>
#include <sodium.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#define MN_PUT_ROOM 64 /* a chunk leaves this much of MN_MAX_FRAME for its CALL head (MN_MSG_PUT_HEAD) */

/*
 * core.put_chunk(call_id, targets, tensor_id, offset, src, src_off, len [, owner]) -> deepest
 * Queues [CALL, seq, "__tensor_put", [tensor_id, offset, bin]] to every
 * target, the bin written straight from src (a string, or an address given
 * as a number whose memory `owner` keeps alive) with no copy.
 */
int mn__core_put_chunk(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
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
    mn_conn_t *k = mn__core_ready_conn(L, c, conn, 0);
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
int mn__core_fetch_into(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
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

static uint64_t bulk_cookie; /* random; a process that reads it at &bulk_cookie is on our kernel and may copy us */

/*
 * core.bulk_self() -> pid, cookie address, cookie: how a proc on this host
 * names and proves this process (__bulk_probe, __bulk_put, __bulk_fetch).
 * Under Yama's ptrace_scope 1 it also lets our descendants (the embedded
 * agent's procs) read and write our memory; nothing else is allowed more.
 */
int mn__core_bulk_self(lua_State *L) {
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
int mn__core_hold(lua_State *L) {
  lctl_t *c = mn__core_ctl(L);
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

int mn__core_holds(lua_State *L) {
  lua_pushnumber(L, (lua_Number)mn__core_ctl(L)->nholds);
  return 1;
}
