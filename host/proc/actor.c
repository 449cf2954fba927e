/*
 * actor.c - Lua actors inside a proc; see actor.h.
 *
 * C owns the lua_State, the bytes and the kernels; Lua (actor_host.lua) owns
 * the modules, the actor instances and the `proc` table actors see. Every
 * entry into Lua is one lua_cpcall of run_op(): decoding the arguments,
 * calling the Lua operation under a traceback handler and packing its
 * results all happen in protected mode, so neither an error in user code nor
 * running out of Lua memory can reach the executor as anything but an error
 * reply.
 */
#include "actor.h"
#include "luapack.h"
#include "sig.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MN_ACTOR_PREFIX "__actor_"        /* what every actor built-in's name starts with */
#define MN_ACTOR_DEPTH (MN_MAX_DEPTH - 2) /* nesting a result may have: the RESULT and its value array take two */
#define MN_ACTOR_MAX_PATH 4096            /* longest path to actor_host.lua */

/* A value a kernel returned through proc.call, kept in C until the kernel is
 * done: pushing onto the Lua stack from inside a kernel could raise a Lua
 * error (out of memory) through the kernel's own frames. */
typedef struct {
  mk_arg_type_t type; /* NIL, BOOL, INT, NUMBER, STRING or BYTES */
  int64_t i;
  double num;
  size_t off, len;    /* STRING and BYTES: a slice of kstr */
} kresult_t;

typedef struct {
  mn_exec_t *x;          /* the executor this state belongs to; NULL: slot free */
  lua_State *L;
  lua_Alloc base;        /* LuaJIT's own allocator, wrapped to count */
  void *base_ud;
  size_t used, peak, limit;
  int ops_ref;           /* registry ref: the table actor_host.lua returned */
  uint64_t next_tensor;
  /* The kernel proc.call is running. */
  kresult_t kres[MN_ACTOR_MAX_KRESULTS];
  int nkres;
  mn_buf_t kstr;
  int kfailed;
  char kerr[MN_MAX_ERRMSG];
  mn_scratch_t scratch;  /* behind the kernel's mk_scratch; its first block is kept between calls */
} actor_state_t;

static actor_state_t states[MN_ACTOR_MAX_STATES];

static actor_state_t *state_of(mn_exec_t *x) {
  for (int i = 0; i < MN_ACTOR_MAX_STATES; i++)
    if (states[i].x == x) return &states[i];
  return NULL;
}

/* ---- the counting allocator ------------------------------------------------- */

/* Refuses growth past the limit (Lua turns the NULL into a memory error)
 * but never a shrink or a free, which Lua assumes cannot fail. */
static void *count_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  actor_state_t *s = ud;
  if (nsize > osize && s->used + (nsize - osize) > s->limit) return NULL;
  void *p = s->base(s->base_ud, ptr, osize, nsize);
  if (p != NULL || nsize == 0) {
    s->used = s->used - osize + nsize;
    if (s->used > s->peak) s->peak = s->used;
  }
  return p;
}

/* ---- msgpack <-> Lua (luapack.c) ------------------------------------------------ */

/* A tensor handle becomes a tensor view made by the Lua host, so an endpoint
 * receives tensors it can read and write. */
static void push_tensor(lua_State *L, uint64_t id, void *ud) {
  actor_state_t *s = ud;
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->ops_ref);
  lua_getfield(L, -1, "view");
  lua_remove(L, -2);
  lua_pushnumber(L, (lua_Number)id);
  lua_call(L, 1, 1);
}

static void push_obj(lua_State *L, actor_state_t *s, const msgpack_object *o) { mn_lua_push(L, o, push_tensor, s); }

/* Packs the value at idx. `what` names it in errors ("result 2"). May raise. */
static void pack_value(lua_State *L, msgpack_packer *pk, int idx, int depth, const char *what) {
  mn_pack_opts_t o = {MN_ACTOR_DEPTH - depth, what, "the controller"};
  mn_lua_pack(L, pk, idx, &o);
}

/* ---- proc.call: kernels run from Lua --------------------------------------------- */

static actor_state_t *K(mk_ctx_t *c) { return (actor_state_t *)c->host; }

/* The kret_* and kerror below are the kernel ABI (monarch_kernel.h), not err.h: they fail with -1. */
static kresult_t *kslot(mk_ctx_t *c) {
  actor_state_t *s = K(c);
  if (s->nkres == MN_ACTOR_MAX_KRESULTS) {
    snprintf(s->kerr, sizeof(s->kerr), "kernel returned more than MN_ACTOR_MAX_KRESULTS (%d) values to Lua",
             MN_ACTOR_MAX_KRESULTS);
    s->kfailed = 1;
    return NULL;
  }
  kresult_t *r = &s->kres[s->nkres++];
  memset(r, 0, sizeof(*r));
  return r;
}
static int kret_nil(mk_ctx_t *c) {
  kresult_t *r = kslot(c);
  if (r == NULL) return -1;
  r->type = MK_ARG_NIL;
  return 0;
}
static int kret_bool(mk_ctx_t *c, int b) {
  kresult_t *r = kslot(c);
  if (r == NULL) return -1;
  r->type = MK_ARG_BOOL;
  r->i = b != 0;
  return 0;
}
static int kret_int(mk_ctx_t *c, int64_t i) {
  kresult_t *r = kslot(c);
  if (r == NULL) return -1;
  r->type = MK_ARG_INT;
  r->i = i;
  return 0;
}
static int kret_number(mk_ctx_t *c, double d) {
  kresult_t *r = kslot(c);
  if (r == NULL) return -1;
  r->type = MK_ARG_NUMBER;
  r->num = d;
  return 0;
}
static int kret_str(mk_ctx_t *c, mk_arg_type_t t, const void *p, size_t n) {
  actor_state_t *s = K(c);
  kresult_t *r = kslot(c);
  if (r == NULL) return -1;
  r->type = t;
  r->off = s->kstr.len;
  r->len = n;
  if (mn_buf_append(&s->kstr, p, n) != 0) {
    snprintf(s->kerr, sizeof(s->kerr), "out of memory holding a %zu-byte result", n);
    s->kfailed = 1;
    return -1;
  }
  return 0;
}
static int kret_string(mk_ctx_t *c, const char *p, size_t n) { return kret_str(c, MK_ARG_STRING, p, n); }
static int kret_bytes(mk_ctx_t *c, const void *p, size_t n) { return kret_str(c, MK_ARG_BYTES, p, n); }
static int kerror(mk_ctx_t *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(K(c)->kerr, sizeof(K(c)->kerr), fmt, ap);
  va_end(ap);
  K(c)->kfailed = 1;
  return -1;
}
/* The executor's contract (scratch.h): every block valid until the kernel returns. */
static void *kscratch(mk_ctx_t *c, size_t n) { return mn_scratch_get(&K(c)->scratch, n); }
static int kcancelled(mk_ctx_t *c) { return atomic_load(K(c)->x->cancel) != 0; }

/* An actor's proc.call passes no groups ('g' arguments are refused), so a kernel it runs has none to use. */
static int knogroup(mk_ctx_t *c, const char *what) {
  kerror(c, "%s: a kernel called from an actor's proc.call has no group (collectives need a mesh call)", what);
  return MN_EINVAL;
}
static int kall_reduce(mk_ctx_t *c, const mk_group_t *g, mk_tensor_t *t, int op) { return knogroup(c, "all_reduce"); }
static int kbroadcast(mk_ctx_t *c, const mk_group_t *g, mk_tensor_t *t, int root) { return knogroup(c, "broadcast"); }
static int kall_gather(mk_ctx_t *c, const mk_group_t *g, const mk_tensor_t *s, mk_tensor_t *d) {
  return knogroup(c, "all_gather");
}
static int kreduce_scatter(mk_ctx_t *c, const mk_group_t *g, const mk_tensor_t *s, mk_tensor_t *d, int op) {
  return knogroup(c, "reduce_scatter");
}
static int kbarrier(mk_ctx_t *c, const mk_group_t *g) { return knogroup(c, "barrier"); }

static const mk_api_t kapi = {kret_nil, kret_bool, kret_int, kret_number, kret_string,
                              kret_bytes, kerror, kscratch, kcancelled,
                              kall_reduce, kbroadcast, kall_gather, kreduce_scatter, kbarrier};

/*
 * Converts Lua argument at idx to what signature letter `want` asks for,
 * with the executor's rules: an integral number arrives as an integer, as if
 * it had come from the controller. Strings point into the Lua stack, which
 * holds them for the whole call. Returns 0, or with err MN_ENOTFOUND (no
 * such tensor) or MN_EINVAL.
 */
static int arg_from_lua(lua_State *L, actor_state_t *s, int idx, char want, int argn, mk_arg_t *a, char *err,
                   size_t errlen) {
  memset(a, 0, sizeof(*a));
  const char *got = luaL_typename(L, idx);
  switch (lua_type(L, idx)) {
  case LUA_TNIL: a->type = MK_ARG_NIL; break;
  case LUA_TBOOLEAN: a->type = MK_ARG_BOOL; a->v.b = lua_toboolean(L, idx); break;
  case LUA_TNUMBER: {
    double d = lua_tonumber(L, idx);
    if (d == floor(d) && fabs(d) < 9.2e18) { a->type = MK_ARG_INT; a->v.i = (int64_t)d; }
    else { a->type = MK_ARG_NUMBER; a->v.num = d; }
    got = a->type == MK_ARG_INT ? "integer" : "number";
    break;
  }
  case LUA_TSTRING: a->type = MK_ARG_STRING; a->v.str.ptr = lua_tolstring(L, idx, &a->v.str.len); break;
  case LUA_TTABLE: {
    lua_pushliteral(L, "__mn_tensor");
    lua_rawget(L, idx);
    int is_tensor = lua_type(L, -1) == LUA_TNUMBER;
    uint64_t id = is_tensor ? (uint64_t)lua_tonumber(L, -1) : 0;
    lua_pop(L, 1);
    if (!is_tensor) {
      snprintf(err, errlen, "argument %d: a table cannot be passed to a kernel (pass tensors as proc.tensor views)", argn);
      return MN_EINVAL;
    }
    a->type = MK_ARG_TENSOR;
    a->v.tensor = mn_tensor_get(&s->x->reg, id);
    if (a->v.tensor == NULL) {
      snprintf(err, errlen, "argument %d: tensor %llu does not exist on this proc (freed?)", argn, (unsigned long long)id);
      return MN_ENOTFOUND;
    }
    got = "tensor";
    break;
  }
  default:
    snprintf(err, errlen, "argument %d: a %s cannot be passed to a kernel", argn, got);
    return MN_EINVAL;
  }
  return mn_sig_coerce(a, want, argn, got, err, errlen);
}

/* Checks the Lua arguments first..first+n-1 against k's signature (the
 * rules of monarch_kernel.h) and converts them; 0, or arg_from_lua's or mn_sig_*'s code with err. */
static int bind_lua_args(lua_State *L, actor_state_t *s, const mk_kernel_t *k, int first, int n, mk_arg_t *argv,
                    char *err, size_t errlen) {
  mn_sig_t sig;
  mn_sig_parse(&sig, k->signature);
  int rc = mn_sig_check_count(&sig, n, err, errlen);
  for (int i = 0; rc == 0 && i < n; i++)
    rc = arg_from_lua(L, s, first + i, mn_sig_letter(&sig, i), i + 1, &argv[i], err, errlen);
  return rc;
}

static actor_state_t *upstate(lua_State *L) { return lua_touserdata(L, lua_upvalueindex(1)); }

/* native.kcall(kernel, ...) -> the kernel's results; raises on any failure. */
static int l_kcall(lua_State *L) {
  actor_state_t *s = upstate(L);
  size_t nl;
  const char *name = luaL_checklstring(L, 1, &nl);
  int n = lua_gettop(L) - 1;
  const mk_kernel_t *k = mn_registry_find(&s->x->reg, name, nl);
  if (k == NULL)
    return luaL_error(L, "proc.call: no kernel named '%s' is loaded on this proc%s", name,
                      s->x->reg.nlibs == 0 ? " (no library loaded yet: call procs:load(...) from the controller)" : "");
  if (n > MN_MAX_ARGS) return luaL_error(L, "proc.call('%s'): %d arguments exceed MN_MAX_ARGS (%d)", name, n, MN_MAX_ARGS);
  mk_arg_t argv[MN_MAX_ARGS];
  char err[256];
  if (bind_lua_args(L, s, k, 2, n, argv, err, sizeof(err)) != 0) return luaL_error(L, "proc.call('%s'): %s", name, err);
  mk_ctx_t ctx = {&kapi, s->x->rank, s->x->world, -1, NULL, k->name, s};
  s->nkres = 0;
  s->kstr.len = 0;
  s->kfailed = 0;
  s->kerr[0] = '\0';
  mn_trace_t *tr = &s->x->trace;
  int64_t t0 = tr->on ? mn_trace_now(tr) : 0;
  int rc = k->fn(&ctx, n, argv);
  if (tr->on) mn_trace_push(tr, MN_TRACE_KCALL, name, nl, t0)->failed = rc != 0 || s->kfailed;
  mn_scratch_release(&s->scratch);
  if (rc != 0 || s->kfailed)
    return luaL_error(L, "proc.call('%s'): %s", name, s->kerr[0] ? s->kerr : "kernel failed without a message");
  luaL_checkstack(L, s->nkres, "too many kernel results");
  for (int i = 0; i < s->nkres; i++) {
    const kresult_t *r = &s->kres[i];
    switch (r->type) {
    case MK_ARG_BOOL: lua_pushboolean(L, (int)r->i); break;
    case MK_ARG_INT: lua_pushnumber(L, (lua_Number)r->i); break;
    case MK_ARG_NUMBER: lua_pushnumber(L, r->num); break;
    case MK_ARG_STRING:
    case MK_ARG_BYTES: lua_pushlstring(L, s->kstr.data + r->off, r->len); break;
    default: lua_pushnil(L);
    }
  }
  return s->nkres;
}

/* ---- tensors, as the Lua host sees them ------------------------------------------ */

/* native.tensor_info(id) -> data (light userdata), dtype, numel, nbytes, {shape}; nil if absent. */
static int l_tensor_info(lua_State *L) {
  actor_state_t *s = upstate(L);
  mk_tensor_t *t = mn_tensor_get(&s->x->reg, (uint64_t)luaL_checknumber(L, 1));
  if (t == NULL) return 0;
  lua_pushlightuserdata(L, t->data);
  lua_pushstring(L, mn_dtype_name(t->dtype));
  lua_pushnumber(L, (lua_Number)t->numel);
  lua_pushnumber(L, (lua_Number)t->nbytes);
  lua_createtable(L, t->ndim, 0);
  for (int i = 0; i < t->ndim; i++) {
    lua_pushnumber(L, (lua_Number)t->shape[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_pushinteger(L, t->device);
  return 6;
}

/* native.tensor_new(dtype, {shape}) -> id of a new zeroed tensor; raises with the reason. */
static int l_tensor_new(lua_State *L) {
  actor_state_t *s = upstate(L);
  size_t dl;
  const char *ds = luaL_checklstring(L, 1, &dl);
  luaL_checktype(L, 2, LUA_TTABLE);
  int dt = mn_dtype_parse(ds, dl);
  if (dt < 0) return luaL_error(L, "proc.new_tensor: unknown dtype '%s' (f32, f64, f16, bf16, i32, i64, u8)", ds);
  int ndim = (int)lua_objlen(L, 2);
  if (ndim > MK_MAX_DIMS) return luaL_error(L, "proc.new_tensor: %d dimensions; MK_MAX_DIMS is %d", ndim, MK_MAX_DIMS);
  int64_t shape[MK_MAX_DIMS];
  for (int i = 0; i < ndim; i++) {
    lua_rawgeti(L, 2, i + 1);
    double d = lua_tonumber(L, -1);
    if (lua_type(L, -1) != LUA_TNUMBER || d < 0 || d != floor(d) || d > 9.0e15)
      return luaL_error(L, "proc.new_tensor: shape entry %d must be a non-negative integer", i + 1);
    shape[i] = (int64_t)d;
    lua_pop(L, 1);
  }
  char err[256];
  uint64_t id = MN_ACTOR_TENSOR_BASE + s->next_tensor++;
  if (mn_tensor_new(&s->x->reg, id, (mk_dtype_t)dt, ndim, shape, err, sizeof(err)) == NULL)
    return luaL_error(L, "proc.new_tensor: %s", err);
  lua_pushnumber(L, (lua_Number)id);
  return 1;
}

/* native.tensor_free(id) -> true if there was such a tensor. */
static int l_tensor_free(lua_State *L) {
  actor_state_t *s = upstate(L);
  lua_pushboolean(L, mn_tensor_free(&s->x->reg, (uint64_t)luaL_checknumber(L, 1)) == 0);
  return 1;
}

/* native.cancelled() -> true once the controller asked the running call to stop. */
static int l_cancelled(lua_State *L) {
  lua_pushboolean(L, atomic_load(upstate(L)->x->cancel) != 0);
  return 1;
}

/* native.memory() -> bytes in use, peak, limit. */
static int l_memory(lua_State *L) {
  actor_state_t *s = upstate(L);
  lua_pushnumber(L, (lua_Number)s->used);
  lua_pushnumber(L, (lua_Number)s->peak);
  lua_pushnumber(L, (lua_Number)s->limit);
  return 3;
}

/* ---- the state ------------------------------------------------------------------ */

static size_t mem_limit(void) {
  const char *e = getenv("MONARCH_ACTOR_MEM_MB");
  long mb = e ? atol(e) : 0;
  return (size_t)(mb > 0 ? mb : MN_ACTOR_MEM_MB_DEFAULT) << 20;
}

/* Runs in protected mode: opens the libraries and runs actor_host.lua with
 * (native, info); keeps the table it returns. */
static int open_state(lua_State *L) {
  actor_state_t *s = lua_touserdata(L, 1);
  char path[MN_ACTOR_MAX_PATH], host[256];
  luaL_openlibs(L);
  snprintf(path, sizeof(path), "%s%s", s->x->reg.prefix ? s->x->reg.prefix : ".", MN_ACTOR_HOST_LUA);
  if (luaL_loadfile(L, path) != 0)
    return luaL_error(L, "cannot load the actor host (%s): %s", path, lua_tostring(L, -1));
  static const luaL_Reg fns[] = {{"kcall", l_kcall},           {"tensor_info", l_tensor_info},
                                 {"tensor_new", l_tensor_new}, {"tensor_free", l_tensor_free},
                                 {"memory", l_memory},         {"cancelled", l_cancelled},
                                 {NULL, NULL}};
  lua_newtable(L); /* stack: chunk, native */
  for (const luaL_Reg *f = fns; f->name; f++) {
    lua_pushlightuserdata(L, s);
    lua_pushcclosure(L, f->func, 1);
    lua_setfield(L, -2, f->name);
  }
  if (gethostname(host, sizeof(host)) != 0) strcpy(host, "?");
  host[sizeof(host) - 1] = '\0';
  lua_newtable(L); /* stack: chunk, native, info */
  lua_pushinteger(L, s->x->rank);
  lua_setfield(L, -2, "rank");
  lua_pushinteger(L, s->x->world);
  lua_setfield(L, -2, "world");
  lua_pushstring(L, host);
  lua_setfield(L, -2, "host");
  lua_pushinteger(L, (lua_Integer)getpid());
  lua_setfield(L, -2, "pid");
  lua_call(L, 2, 1);
  if (!lua_istable(L, -1)) return luaL_error(L, "%s did not return a table", path);
  s->ops_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

/* Makes x's state into *out; 0, or with err MN_ELIMIT, MN_ENOMEM or MN_EKERNEL (the Lua host failed to start). */
static int make_state(mn_exec_t *x, actor_state_t **out, char *err, size_t errlen) {
  actor_state_t *s = state_of(NULL);
  if (s == NULL) {
    snprintf(err, errlen, "more than MN_ACTOR_MAX_STATES (%d) executors host actors in this process", MN_ACTOR_MAX_STATES);
    return MN_ELIMIT;
  }
  memset(s, 0, sizeof(*s));
  s->L = luaL_newstate();
  if (s->L == NULL) {
    snprintf(err, errlen, "cannot create a Lua state for actors (out of memory)");
    return MN_ENOMEM;
  }
  s->x = x;
  s->limit = mem_limit();
  s->used = s->peak = (size_t)lua_gc(s->L, LUA_GCCOUNT, 0) * 1024 + (size_t)lua_gc(s->L, LUA_GCCOUNTB, 0);
  s->base = lua_getallocf(s->L, &s->base_ud);
  lua_setallocf(s->L, count_alloc, s);
  mn_buf_init(&s->kstr);
  if (lua_cpcall(s->L, open_state, s) != 0) {
    snprintf(err, errlen, "%s", lua_isstring(s->L, -1) ? lua_tostring(s->L, -1) : "cannot start the actor host");
    lua_setallocf(s->L, s->base, s->base_ud);
    lua_close(s->L);
    mn_buf_free(&s->kstr);
    memset(s, 0, sizeof(*s));
    return MN_EKERNEL;
  }
  *out = s;
  return 0;
}

void mn_actor_close(mn_exec_t *x) {
  actor_state_t *s = state_of(x);
  if (s == NULL || x == NULL) return;
  lua_State *L = s->L;
  /* Best effort: stop every actor so the tensors they made are freed. */
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->ops_ref);
  lua_getfield(L, -1, "close_all");
  if (lua_pcall(L, 0, 0, 0) != 0) fprintf(stderr, "monarch actors: closing: %s\n", lua_tostring(L, -1));
  /* LuaJIT frees its arena only when it sees its own allocator at close. */
  lua_setallocf(L, s->base, s->base_ud);
  lua_close(L);
  mn_buf_free(&s->kstr);
  mn_scratch_close(&s->scratch);
  memset(s, 0, sizeof(*s));
}

/* ---- one built-in, in protected mode --------------------------------------------- */

typedef struct {
  actor_state_t *s;
  const char *op;             /* operation of the Lua host: "call", "spawn", ... */
  const msgpack_object *args;
  const char *kind;           /* error kind, when the operation failed */
  char *err;
  size_t errlen;
  int failed;
} job_t;

/* Copies a message into the job's error buffer; a long traceback is cut at a
 * line boundary so what is kept reads whole. */
static void set_error(job_t *j, const char *kind, const char *msg) {
  size_t n = strlen(msg);
  j->kind = kind;
  j->failed = 1;
  if (n < j->errlen) {
    memcpy(j->err, msg, n + 1);
    return;
  }
  static const char more[] = "\n\t...";
  size_t keep = j->errlen - sizeof(more);
  while (keep > 0 && msg[keep] != '\n') keep--;
  if (keep == 0) keep = j->errlen - sizeof(more);
  memcpy(j->err, msg, keep);
  memcpy(j->err + keep, more, sizeof(more));
}

/* Turns the error value on top of the stack into the job's error: a usage
 * error from the host is a table {kind, message}; anything else is an error
 * in actor code, already carrying its traceback. */
static void take_error(lua_State *L, job_t *j) {
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "kind");
    lua_getfield(L, -2, "message");
    const char *kind = lua_tostring(L, -2), *msg = lua_tostring(L, -1);
    /* Only the host's fixed kinds; the strings must outlive the Lua values. */
    set_error(j, kind && strcmp(kind, "bad_args") == 0 ? "bad_args" : "actor", msg ? msg : "error without a message");
    lua_pop(L, 2);
    return;
  }
  const char *msg = lua_tostring(L, -1);
  set_error(j, "actor", msg ? msg : "error object is not a string");
}

/* A memory error carries no traceback; say what the limit is instead. */
static int oom(job_t *j) {
  char msg[200];
  snprintf(msg, sizeof(msg), "actor Lua state out of memory: %zu MiB in use, limit %zu MiB (set MONARCH_ACTOR_MEM_MB)",
           j->s->used >> 20, j->s->limit >> 20);
  set_error(j, "actor", msg);
  return 0;
}

/* stack: job (light userdata). Calls ops[op](args...) under ops.traceback and
 * packs what it returns as the call's results. */
static int run_op(lua_State *L) {
  job_t *j = lua_touserdata(L, 1);
  actor_state_t *s = j->s;
  mn_exec_t *x = s->x;
  lua_settop(L, 0);
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->ops_ref);
  lua_getfield(L, 1, "traceback"); /* stack: ops, traceback */
  lua_getfield(L, 1, j->op);       /* stack: ops, traceback, fn */
  uint32_t n = j->args->via.array.size;
  luaL_checkstack(L, (int)n + LUA_MINSTACK, "too many arguments");
  for (uint32_t i = 0; i < n; i++) push_obj(L, s, &j->args->via.array.ptr[i]);
  int rc = lua_pcall(L, (int)n, LUA_MULTRET, 2);
  if (rc == LUA_ERRMEM) return oom(j);
  if (rc != 0) {
    take_error(L, j);
    return 0;
  }
  int top = lua_gettop(L);
  if (top - 2 > MN_MAX_RESULTS)
    return luaL_error(L, "returned %d values; MN_MAX_RESULTS is %d", top - 2, MN_MAX_RESULTS);
  char what[32];
  for (int i = 3; i <= top; i++) {
    snprintf(what, sizeof(what), "result %d", i - 2);
    pack_value(L, &x->rpk, i, 0, what);
    x->nresults++;
  }
  return 0;
}

/* An endpoint's span is named "actor.endpoint" (a resumed one "actor.(resumed)"), not "__actor_call". */
static void trace_label(mn_exec_t *x, const char *op, const msgpack_object *args) {
  const char *a, *e = "(resumed)";
  size_t al, el = strlen(e);
  int call = strcmp(op, "call") == 0;
  if ((!call && strcmp(op, "resume") != 0) || mn_get_str(args, 0, &a, &al) != 0) return;
  if (call && mn_get_str(args, 1, &e, &el) != 0) return;
  mn_trace_label(&x->trace, MN_TRACE_ENDPOINT, a, al, e, el);
}

/* Every "__actor_" built-in: runs the Lua host's operation of the same name
 * (the part after the prefix), making the actor state first if need be. */
static int run_actor_op(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                        size_t errlen) {
  actor_state_t *s = state_of(x);
  int rc = s == NULL ? make_state(x, &s, err, errlen) : 0;
  if (rc != 0) {
    x->err_kind = "actor";
    return rc;
  }
  job_t j = {s, b->name + sizeof(MN_ACTOR_PREFIX) - 1, args, NULL, err, errlen, 0};
  if (x->trace.on) trace_label(x, j.op, args);
  size_t rstart = x->rbuf.len;
  rc = lua_cpcall(s->L, run_op, &j);
  if (rc == LUA_ERRMEM) {
    oom(&j);
  } else if (rc != 0) {
    take_error(s->L, &j);
  }
  lua_settop(s->L, 0);
  if (!j.failed) return 0;
  /* Nothing half-packed may reach the reply. */
  x->rbuf.len = rstart;
  x->nresults = 0;
  x->err_kind = j.kind;
  return MN_EKERNEL; /* the actor (or the Lua host) reported it; j.kind says how */
}

/* Names after the first are listed without "__actor": "__actor_define, _has, ...". */
static void actor_unknown(const mn_builtin_module_t *m, const char *name, size_t nl, char *err, size_t errlen) {
  char names[256];
  snprintf(err, errlen, "unknown built-in '%.*s' (actors know %s)", (int)nl, name,
           mn_exec_builtin_names(m, sizeof(MN_ACTOR_PREFIX) - 2, names, sizeof(names)));
}

static const mn_builtin_t entries[] = {
  {MN_ACTOR_PREFIX "define", run_actor_op, "(hash, source, chunkname)"},
  {MN_ACTOR_PREFIX "has", run_actor_op, "(hash)"},
  {MN_ACTOR_PREFIX "spawn", run_actor_op, "(name, hash, args, deps)"},
  {MN_ACTOR_PREFIX "call", run_actor_op, "(name, endpoint, args...)"},
  {MN_ACTOR_PREFIX "resume", run_actor_op, "(name, token, ok, value)"},
  {MN_ACTOR_PREFIX "stop", run_actor_op, "(name)"},
  {MN_ACTOR_PREFIX "stats", run_actor_op, "()"},
};

static const mn_builtin_module_t module = {MN_ACTOR_PREFIX, entries, (int)(sizeof(entries) / sizeof(entries[0])),
                                           actor_unknown};

int mn_actor_register(void) { return mn_exec_register(&module); }
