/* luapack.c - see luapack.h. */
#include "luapack.h"
#include "wire.h"

#include <lauxlib.h>
#include <math.h>
#include <stdarg.h>

#define MN_LUA_TCDATA 10 /* LuaJIT's type tag of FFI cdata (lua.h does not name it) */

/* Raises msg without a position: it names the value that was wrong, and a line of ours would only mislead. */
static void raise_plain(lua_State *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_error(L);
}

static void pack(lua_State *L, msgpack_packer *pk, int idx, int depth, const mn_pack_opts_t *o) {
  if (depth > o->max_depth)
    raise_plain(L, "%s: tables nest deeper than %d levels (or contain a cycle)", o->what, o->max_depth);
  luaL_checkstack(L, 4, "values nest too deeply");
  if (idx < 0) idx = lua_gettop(L) + idx + 1;
  switch (lua_type(L, idx)) {
  case LUA_TNIL: msgpack_pack_nil(pk); break;
  case LUA_TBOOLEAN:
    if (lua_toboolean(L, idx)) msgpack_pack_true(pk);
    else msgpack_pack_false(pk);
    break;
  case LUA_TNUMBER: {
    double d = lua_tonumber(L, idx);
    if (d == floor(d) && fabs(d) < 9.2e18) msgpack_pack_int64(pk, (int64_t)d);
    else msgpack_pack_double(pk, d);
    break;
  }
  case LUA_TSTRING: {
    size_t n;
    const char *s = lua_tolstring(L, idx, &n);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
    break;
  }
  case LUA_TTABLE: {
    lua_pushliteral(L, "__mn_tensor");
    lua_rawget(L, idx);
    if (lua_type(L, -1) == LUA_TNUMBER) {
      uint64_t id = (uint64_t)lua_tonumber(L, -1);
      unsigned char b[8];
      for (int i = 7; i >= 0; i--, id >>= 8) b[i] = (unsigned char)id;
      lua_pop(L, 1);
      msgpack_pack_ext(pk, 8, MN_EXT_TENSOR);
      msgpack_pack_ext_body(pk, b, 8);
      break;
    }
    lua_pop(L, 1);
    size_t n = lua_objlen(L, idx), count = 0;
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
      count++;
      lua_pop(L, 1);
    }
    if (count > MN_MAX_ITEMS) raise_plain(L, "%s: a table of %d entries exceeds MN_MAX_ITEMS", o->what, (int)count);
    if (count == n) { /* a proper array (or empty): keys 1..n and nothing else */
      msgpack_pack_array(pk, n);
      for (size_t i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, (int)i);
        pack(L, pk, -1, depth + 1, o);
        lua_pop(L, 1);
      }
      break;
    }
    msgpack_pack_map(pk, count);
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
      pack(L, pk, -2, depth + 1, o);
      pack(L, pk, -1, depth + 1, o);
      lua_pop(L, 1);
    }
    break;
  }
  default:
    raise_plain(L, "%s: a %s cannot be sent to %s (send nil, booleans, numbers, strings, tables%s)", o->what,
               luaL_typename(L, idx), o->to, lua_type(L, idx) == MN_LUA_TCDATA ? "; convert cdata with tonumber" : "");
  }
}

void mn_lua_pack(lua_State *L, msgpack_packer *pk, int idx, const mn_pack_opts_t *o) { pack(L, pk, idx, 0, o); }

void mn_lua_push(lua_State *L, const msgpack_object *o, mn_lua_tensor_fn tensor, void *ud) {
  luaL_checkstack(L, 4, "values nest too deeply");
  switch (o->type) {
  case MSGPACK_OBJECT_NIL: lua_pushnil(L); break;
  case MSGPACK_OBJECT_BOOLEAN: lua_pushboolean(L, o->via.boolean); break;
  case MSGPACK_OBJECT_POSITIVE_INTEGER: lua_pushnumber(L, (lua_Number)o->via.u64); break;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: lua_pushnumber(L, (lua_Number)o->via.i64); break;
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64: lua_pushnumber(L, o->via.f64); break;
  case MSGPACK_OBJECT_STR: lua_pushlstring(L, o->via.str.ptr, o->via.str.size); break;
  case MSGPACK_OBJECT_BIN: lua_pushlstring(L, o->via.bin.ptr, o->via.bin.size); break;
  case MSGPACK_OBJECT_ARRAY:
    lua_createtable(L, (int)o->via.array.size, 0);
    for (uint32_t i = 0; i < o->via.array.size; i++) {
      mn_lua_push(L, &o->via.array.ptr[i], tensor, ud);
      lua_rawseti(L, -2, (int)i + 1);
    }
    break;
  case MSGPACK_OBJECT_MAP:
    lua_createtable(L, 0, (int)o->via.map.size);
    for (uint32_t i = 0; i < o->via.map.size; i++) {
      mn_lua_push(L, &o->via.map.ptr[i].key, tensor, ud);
      mn_lua_push(L, &o->via.map.ptr[i].val, tensor, ud);
      if (lua_isnil(L, -2) || (lua_type(L, -2) == LUA_TNUMBER && isnan(lua_tonumber(L, -2)))) lua_pop(L, 2);
      else lua_rawset(L, -3);
    }
    break;
  case MSGPACK_OBJECT_EXT: {
    uint64_t id = 0;
    for (uint32_t i = 0; i < o->via.ext.size && i < 8; i++) id = (id << 8) | (unsigned char)o->via.ext.ptr[i];
    if (o->via.ext.type == MN_EXT_TENSOR && o->via.ext.size == 8 && tensor != NULL) tensor(L, id, ud);
    else lua_pushnumber(L, (lua_Number)id);
    break;
  }
  default: lua_pushnil(L);
  }
}
