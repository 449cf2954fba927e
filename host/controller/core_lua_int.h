/*
 * core_lua_int.h - what the files of the monarch.core module share: its
 * state (lctl_t), and the functions core_lua.c registers, by the file that
 * holds each (core_conn.c, core_call.c, core_results.c, core_bulk.c,
 * core_join.c, core_ship.c, core_config.c). The controller's engine (ctl*.c) includes no
 * Lua header; these files are its only Lua face (tests/layers.sh checks).
 */
#ifndef MN_CORE_LUA_INT_H
#define MN_CORE_LUA_INT_H

#include "ctl.h"
#include "ctl_join.h"
#include "luapack.h"

#include <lauxlib.h>
#include <lua.h>

/* Where a fetch's bytes land: RESULT bins of (call, slot) are copied here. */
typedef struct {
  double call;
  int32_t slot;
  char *dest;
  size_t cap;
} mn_dest_t;

/* Memory a proc copies by itself (same-host bulk): kept alive until (call, slot)'s RESULT, or until the
 * connection is closed and its process gone (it could still be copying). */
typedef struct {
  double call;
  int32_t slot;
  int conn;
  int64_t pid;
  int ref;
} mn_hold_t;

#define MN_COLLECT_SLOTS 1024 /* calls collected at once; a call that finds its slot taken is answered per slot */

typedef struct {
  mn_ctl_t ctl;
  int open;
  mn_buf_t scratch;
  msgpack_zone zone;
  mn_dest_t *dests;
  size_t ndests, dcap;
  mn_hold_t *holds;
  size_t nholds, hcap;
  mn_join_t join; /* the join port, when the script listens (core.listen) */
  /* Calls whose successful answers C stores straight into their values table (core.collect), by
   * call id modulo MN_COLLECT_SLOTS; and the run of such answers not yet told to Lua. */
  struct {
    double call;
    int ref; /* LUA_NOREF: free */
  } collect[MN_COLLECT_SLOTS];
  double run_call;
  int run_n;
  int *ids;      /* a call's targets, read out of their Lua array once (core.call) */
  size_t ids_cap;
  /* The kept targets list ids holds (calls.lua sets its `epoch` while no proc changed): its next call
   * with that epoch reads nothing. ids_ref holds the table (LUA_NOREF: none). */
  int ids_ref;
  double ids_epoch;
  size_t ids_n;
  int fail_cast_in; /* test hook (core.test_fail_queue): the n-th target queued from now fails for memory */
  void (*before_close)(void *data); /* mn_lua_before_close: run before the loop closes */
  void *before_close_data;
} lctl_t;

/* The module's controller state; raises unless core.init ran. */
lctl_t *mn__core_ctl(lua_State *L);

static inline void mn__core_push_obj(lua_State *L, const msgpack_object *o) { mn_lua_push(L, o, NULL, NULL); }

/* Packs Lua value idx as argument argn of a CALL (kernel named in errors, or NULL) or of a message; raises
 * for a value that cannot be sent. The frame's and the argument array's nesting levels are counted. */
void mn__core_encode(lua_State *L, msgpack_packer *pk, int idx, int argn, const char *kernel);
/* Connection id, if it can take frames now (or, with or_reconnecting, calls once it is back); else raises. */
mn_conn_t *mn__core_ready_conn(lua_State *L, lctl_t *c, int id, int or_reconnecting);

/* ---- core.X, by file ---- */

/* core_conn.c */
int mn__core_start_agent(lua_State *L);
int mn__core_connect(lua_State *L);
int mn__core_connect_relayed(lua_State *L);
int mn__core_connect_pooled(lua_State *L);
int mn__core_unlinked(lua_State *L);
int mn__core_disconnect(lua_State *L);
int mn__core_info(lua_State *L);
int mn__core_relay(lua_State *L);
int mn__core_relayed(lua_State *L);
int mn__core_send(lua_State *L);
int mn__core_spawn(lua_State *L);
int mn__core_tree_build(lua_State *L);
/* core_call.c */
int mn__core_check_call(lua_State *L);
int mn__core_test_fail_queue(lua_State *L);
int mn__core_call(lua_State *L);
int mn__core_call_as(lua_State *L);
int mn__core_oldest(lua_State *L);
int mn__core_take_pending(lua_State *L);
int mn__core_inflight(lua_State *L);
int mn__core_cancel(lua_State *L);
/* core_results.c */
int mn__core_poll(lua_State *L);
int mn__core_collect(lua_State *L);
int mn__core_uncollect(lua_State *L);
/* core_bulk.c */
int mn__core_put_chunk(lua_State *L);
int mn__core_fetch_into(lua_State *L);
int mn__core_bulk_self(lua_State *L);
int mn__core_hold(lua_State *L);
int mn__core_holds(lua_State *L);
/* core_ship.c */
int mn__core_ship_hash(lua_State *L);
int mn__core_ship_read(lua_State *L);
int mn__core_ship_elf(lua_State *L);
int mn__core_ship_ask(lua_State *L);
int mn__core_ship_send(lua_State *L);
int mn__core_ship_stats(lua_State *L);
int mn__core_listdir(lua_State *L);
int mn__core_stat(lua_State *L);

/* core_join.c */
int mn__core_listen(lua_State *L);
int mn__core_joins(lua_State *L);
/* core_config.c */
int mn__core_cast_stats(lua_State *L);
int mn__core_configure(lua_State *L);

#endif
