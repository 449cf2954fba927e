/* core_lua_int.h - what core_lua.c (the monarch.core module) and core_results.c (its results path) share. */
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
} lctl_t;

/* The module's controller state; raises unless core.init ran. */
lctl_t *mn__core_ctl(lua_State *L);

static inline void mn__core_push_obj(lua_State *L, const msgpack_object *o) { mn_lua_push(L, o, NULL, NULL); }

/* core.poll, core.collect and core.uncollect (core_results.c). */
int mn__core_poll(lua_State *L);
int mn__core_collect(lua_State *L);
int mn__core_uncollect(lua_State *L);

#endif
