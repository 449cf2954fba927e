/*
 * luapack.h - Lua values <-> msgpack, shared by the controller's Lua module
 * (call arguments out, results in) and the proc's actor host (endpoint
 * arguments in, results out), so both sides agree on every conversion.
 */
#ifndef MN_LUAPACK_H
#define MN_LUAPACK_H

#include <lua.h>
#include <msgpack.h>
#include <stdint.h>

#define MN_EXT_TENSOR 1 /* msgpack ext type of a tensor handle: 8-byte big-endian id */

typedef struct {
  int max_depth;    /* deepest nesting allowed */
  const char *what; /* names the value in errors: "argument 2", "result 1" */
  const char *to;   /* where it goes, for errors: "a proc", "the controller" */
} mn_pack_opts_t;

/*
 * Packs the value at idx. Numbers with an integral value become msgpack
 * ints; a table with a numeric __mn_tensor field becomes a tensor handle; a
 * table whose keys are exactly 1..n an array, any other table a map.
 * Raises a Lua error naming o->what for what cannot be sent.
 */
void mn_lua_pack(lua_State *L, msgpack_packer *pk, int idx, const mn_pack_opts_t *o);

/* Called for a tensor handle while pushing; must push exactly one value. */
typedef void (*mn_lua_tensor_fn)(lua_State *L, uint64_t id, void *ud);

/*
 * Pushes o as a Lua value. Tensor handles go to `tensor` (or are pushed as
 * their id when it is NULL). Map entries with a nil or NaN key are dropped.
 * May raise (deep nesting exhausts the Lua stack).
 */
void mn_lua_push(lua_State *L, const msgpack_object *o, mn_lua_tensor_fn tensor, void *ud);

#endif
