/*
 * test_actor.c - unit tests for host/worker/actor.c (the "__actor_"
 * built-ins and their LuaJIT state) and kernels/cpu/cartpole.c.
 *
 * CALL frames go to mn_exec_frame() as the proc's I/O thread would hand
 * them over; replies are decoded from x->out. actor_host.lua and the kernel
 * libraries come from $MONARCH_PREFIX, default build (tests run from the
 * repository root).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actor.h"
#include "exec.h"
#include "wire.h"

/* ---- fixture -------------------------------------------------------------------- */

typedef struct {
  mn_exec_t x;
  atomic_int cancel;
  uint64_t seq;
  char *body;        /* the last reply */
  msgpack_zone zone;
  msgpack_object reply;
} fix_t;

static const char *prefix(void) {
  const char *p = getenv("MONARCH_PREFIX");
  return p && *p ? p : "build";
}

static int setup(void **state) {
  fix_t *f = calloc(1, sizeof(*f));
  if (f == NULL) return -1;
  atomic_init(&f->cancel, 0);
  if (mn_exec_init(&f->x, prefix(), 1, 4, &f->cancel) != 0) return -1;
  if (!msgpack_zone_init(&f->zone, 4096)) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fix_t *f = *state;
  mn_actor_close(&f->x);
  mn_exec_close(&f->x);
  msgpack_zone_destroy(&f->zone);
  free(f->body);
  free(f);
  return 0;
}

/* ---- calls ---------------------------------------------------------------------- */

typedef struct {
  mn_buf_t b;
  msgpack_packer pk;
  size_t start;
} call_t;

static msgpack_packer *begin(fix_t *f, call_t *c, const char *name, uint32_t nargs) {
  mn_buf_init(&c->b);
  msgpack_packer_init(&c->pk, &c->b, mn_buf_write_cb);
  c->start = mn_frame_begin(&c->b);
  msgpack_pack_array(&c->pk, 4);
  msgpack_pack_int(&c->pk, MN_MSG_CALL);
  msgpack_pack_uint64(&c->pk, ++f->seq);
  mn_pack_cstr(&c->pk, name);
  msgpack_pack_array(&c->pk, nargs);
  return &c->pk;
}

/* Runs the call and decodes its one reply into f->reply. */
static void run(fix_t *f, call_t *c) {
  const char *body;
  char err[256];
  mn_frame_end(&c->b, c->start);
  int64_t n = mn_frame_peek(c->b.data, c->b.len, MN_MAX_FRAME, &body);
  assert_true(n > 0);
  assert_int_equal(mn_exec_frame(&f->x, body, (size_t)n), 0);
  mn_buf_free(&c->b);
  n = mn_frame_peek(f->x.out.data, f->x.out.len, MN_MAX_FRAME, &body);
  assert_true(n > 0);
  assert_int_equal(f->x.out.len, MN_FRAME_HEADER + (size_t)n);
  free(f->body);
  f->body = malloc((size_t)n);
  assert_non_null(f->body);
  memcpy(f->body, body, (size_t)n);
  f->x.out.len = 0;
  msgpack_zone_clear(&f->zone);
  assert_int_equal(mn_decode(f->body, (size_t)n, &f->zone, &f->reply, err, sizeof(err)), 0);
}

/* The values of an ok reply. */
static const msgpack_object *ok_values(fix_t *f) {
  const msgpack_object *o = &f->reply;
  if (!o->via.array.ptr[2].via.boolean) {
    const msgpack_object *m = mn_map_get(&o->via.array.ptr[3], "message");
    print_error("call failed: %.*s\n", m ? (int)m->via.str.size : 1, m ? m->via.str.ptr : "?");
  }
  assert_true(o->via.array.ptr[2].via.boolean);
  return &o->via.array.ptr[3];
}

/* Checks a failed reply's kind, and that its message holds `needle`. */
static void expect_fail(fix_t *f, const char *kind, const char *needle) {
  const msgpack_object *o = &f->reply;
  assert_false(o->via.array.ptr[2].via.boolean);
  const msgpack_object *k = mn_map_get(&o->via.array.ptr[3], "kind");
  const msgpack_object *m = mn_map_get(&o->via.array.ptr[3], "message");
  assert_non_null(k);
  assert_non_null(m);
  char kb[64], mb[MN_MAX_ERRMSG + 1];
  snprintf(kb, sizeof(kb), "%.*s", (int)k->via.str.size, k->via.str.ptr);
  snprintf(mb, sizeof(mb), "%.*s", (int)m->via.str.size, m->via.str.ptr);
  if (strcmp(kb, kind) != 0 || strstr(mb, needle) == NULL)
    print_error("got kind \"%s\", message \"%s\"; wanted \"%s\" with \"%s\"\n", kb, mb, kind, needle);
  assert_string_equal(kb, kind);
  assert_non_null(strstr(mb, needle));
}

static void pack_str(msgpack_packer *pk, const char *s) { mn_pack_cstr(pk, s); }

static void pack_tensor(msgpack_packer *pk, uint64_t id) {
  char be[8];
  for (int i = 0; i < 8; i++) be[i] = (char)(id >> (56 - 8 * i));
  msgpack_pack_ext(pk, 8, 1);
  msgpack_pack_ext_body(pk, be, 8);
}

/* The content hash lua/monarch/actor.lua names sources by. */
static void content_hash(const char *s, char *out, size_t outlen) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char *p = s; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  snprintf(out, outlen, "fnv1a64-%016llx-%zu", (unsigned long long)h, strlen(s));
}

static void define(fix_t *f, const char *hash, const char *source, const char *chunkname) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, "__actor_define", 3);
  pack_str(pk, hash);
  pack_str(pk, source);
  pack_str(pk, chunkname);
  run(f, &c);
}

static void spawn(fix_t *f, const char *name, const char *hash) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, "__actor_spawn", 4);
  pack_str(pk, name);
  pack_str(pk, hash);
  msgpack_pack_map(pk, 0);
  msgpack_pack_map(pk, 0);
  run(f, &c);
}

/* Calls endpoint with no arguments, or one number when num is not NAN. */
static void call_ep(fix_t *f, const char *name, const char *endpoint, double num) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, "__actor_call", isnan(num) ? 2 : 3);
  pack_str(pk, name);
  pack_str(pk, endpoint);
  if (!isnan(num)) msgpack_pack_double(pk, num);
  run(f, &c);
}

static const char COUNTER[] =
    "local C = {}\n"
    "C.__index = C\n"
    "function C.new(args, ctx) return setmetatable({ n = 0, rank = ctx.rank }, C) end\n"
    "function C:add(k) self.n = self.n + k return self.n, self.rank end\n"
    "function C:boom() local t = nil\n  return t.field\nend\n"
    "function C:hog(mb) local t = {} for i = 1, mb * 1024 * 64 do t[i] = i + 0.5 end return #t end\n"
    "function C:deep() local t = {} local c = t for i = 1, 40 do c.x = {} c = c.x end return t end\n"
    "function C:mixed() return { 1, 2, name = 'x' }, { [1] = 'a', [3] = 'c' } end\n"
    "return C\n";

/* ---- actors ----------------------------------------------------------------------- */

static void test_define_spawn_call(void **state) {
  fix_t *f = *state;
  char hash[64];
  content_hash(COUNTER, hash, sizeof(hash));
  define(f, hash, COUNTER, "@counter.lua");
  ok_values(f);
  spawn(f, "c", hash);
  ok_values(f);
  call_ep(f, "c", "add", 2);
  const msgpack_object *v = ok_values(f);
  assert_int_equal(v->via.array.size, 2);
  assert_int_equal(v->via.array.ptr[0].via.u64, 2);
  assert_int_equal(v->via.array.ptr[1].via.u64, 1); /* the rank given to mn_exec_init */
  call_ep(f, "c", "add", 3);
  v = ok_values(f);
  assert_int_equal(v->via.array.ptr[0].via.u64, 5); /* state kept */
  /* A proper array packs as an array, anything else as a map. */
  call_ep(f, "c", "mixed", NAN);
  v = ok_values(f);
  assert_int_equal(v->via.array.ptr[0].type, MSGPACK_OBJECT_MAP);
  assert_int_equal(v->via.array.ptr[0].via.map.size, 3);
  assert_int_equal(v->via.array.ptr[1].type, MSGPACK_OBJECT_MAP);
}

static void test_errors_keep_the_state_alive(void **state) {
  fix_t *f = *state;
  char hash[64];
  content_hash(COUNTER, hash, sizeof(hash));
  define(f, "fnv1a64-0000000000000000-3", COUNTER, "@counter.lua");
  expect_fail(f, "bad_args", "does not match its hash");
  spawn(f, "c", hash);
  expect_fail(f, "bad_args", "was never defined on this proc");
  define(f, hash, COUNTER, "@counter.lua");
  spawn(f, "c", hash);
  ok_values(f);
  spawn(f, "c", hash);
  expect_fail(f, "actor", "an actor named 'c' already runs on this proc");
  call_ep(f, "c", "boom", NAN);
  expect_fail(f, "actor", "counter.lua:6: attempt to index local 't' (a nil value)\nstack traceback:");
  call_ep(f, "c", "nope", NAN);
  expect_fail(f, "actor", "has no endpoint 'nope' (endpoints: add, boom, deep, hog, mixed)");
  call_ep(f, "nobody", "add", 1);
  expect_fail(f, "actor", "no actor named 'nobody' on this proc");
  call_ep(f, "c", "deep", NAN);
  expect_fail(f, "actor", "result 1: tables nest deeper than 14 levels");
  call_ep(f, "c", "add", 1);
  assert_int_equal(ok_values(f)->via.array.ptr[0].via.u64, 1);
  call_ep(f, "c", "add", NAN); /* k is nil: an error in the actor's arithmetic */
  expect_fail(f, "actor", "attempt to perform arithmetic");
  call_t c;
  begin(f, &c, "__actor_nothing", 0);
  run(f, &c);
  expect_fail(f, "bad_args", "unknown built-in '__actor_nothing'");
  /* The list comes from the table of actor built-ins (actor.c) and reads as it always has. */
  expect_fail(f, "bad_args",
              "unknown built-in '__actor_nothing' (actors know __actor_define, _has, _spawn, _call, _resume, _stop, _stats)");
}

static void test_memory_limit(void **state) {
  fix_t *f = *state;
  char hash[64];
  assert_int_equal(setenv("MONARCH_ACTOR_MEM_MB", "32", 1), 0);
  content_hash(COUNTER, hash, sizeof(hash));
  define(f, hash, COUNTER, "@counter.lua");
  assert_int_equal(unsetenv("MONARCH_ACTOR_MEM_MB"), 0);
  spawn(f, "c", hash);
  ok_values(f);
  call_ep(f, "c", "hog", 64); /* 64 MiB of doubles in a table: over the limit */
  expect_fail(f, "actor", "out of memory");
  call_ep(f, "c", "hog", 1); /* and the state still serves */
  assert_int_equal(ok_values(f)->via.array.ptr[0].via.u64, 65536);
  call_t c;
  begin(f, &c, "__actor_stats", 0);
  run(f, &c);
  const msgpack_object *st = &ok_values(f)->via.array.ptr[0];
  const msgpack_object *limit = mn_map_get(st, "mem_limit");
  const msgpack_object *errors = mn_map_get(st, "errors");
  assert_non_null(limit);
  assert_int_equal(limit->via.u64, 32u << 20);
  assert_non_null(errors);
}

/* ---- proc.call and tensors from an actor -------------------------------------------- */

static const char KUSER[] =
    "local K = {}\n"
    "function K.new() return K end\n"
    "function K.go(_, t)\n"
    "  proc.call('fill', t, 1.5)\n"
    "  local mine = proc.new_tensor('f64', { 3 })\n"
    "  mine.data[2] = 4\n"
    "  return proc.call('sum', t), proc.call('sum', mine), proc.call('echo', 'a', 2, true, nil, 2.5)\n"
    "end\n"
    "function K.bad(_, t) return proc.call('fill', t) end\n"
    "function K.wrong_type(_, t) return proc.call('fill', t, 'x') end\n"
    "function K.too_many(_, t) return proc.call('iota', t, 1, 2) end\n"
    "return K\n";

static void test_kernels_from_lua(void **state) {
  fix_t *f = *state;
  call_t c;
  msgpack_packer *pk = begin(f, &c, "__load", 1);
  pack_str(pk, "basic");
  run(f, &c);
  ok_values(f);
  pk = begin(f, &c, "__tensor_new", 3);
  msgpack_pack_uint64(pk, 7);
  pack_str(pk, "f32");
  msgpack_pack_array(pk, 1);
  msgpack_pack_int(pk, 4);
  run(f, &c);
  ok_values(f);
  char hash[64];
  content_hash(KUSER, hash, sizeof(hash));
  define(f, hash, KUSER, "@kuser.lua");
  spawn(f, "k", hash);
  ok_values(f);
  pk = begin(f, &c, "__actor_call", 3);
  pack_str(pk, "k");
  pack_str(pk, "go");
  pack_tensor(pk, 7);
  run(f, &c);
  const msgpack_object *v = ok_values(f);
  assert_int_equal(v->via.array.size, 7);
  assert_true(fabs(v->via.array.ptr[0].via.f64 - 6.0) < 1e-9 || v->via.array.ptr[0].via.u64 == 6);
  assert_int_equal(v->via.array.ptr[1].via.u64, 4);
  assert_int_equal(v->via.array.ptr[2].type, MSGPACK_OBJECT_STR);
  assert_int_equal(v->via.array.ptr[5].type, MSGPACK_OBJECT_NIL);
  assert_true(v->via.array.ptr[6].via.f64 == 2.5);
  mk_tensor_t *t = mn_tensor_get(&f->x.reg, 7);
  assert_non_null(t);
  assert_true(((float *)t->data)[3] == 1.5f);
  size_t before = f->x.reg.ntensors;
  assert_int_equal(before, 2); /* the controller's and the actor's */
  pk = begin(f, &c, "__actor_call", 3);
  pack_str(pk, "k");
  pack_str(pk, "bad");
  pack_tensor(pk, 7);
  run(f, &c);
  expect_fail(f, "actor", "proc.call('fill'): expected 2 arguments, got 1");
  /* The executor's signature rules and texts (sig.c), from Lua. */
  pk = begin(f, &c, "__actor_call", 3);
  pack_str(pk, "k");
  pack_str(pk, "wrong_type");
  pack_tensor(pk, 7);
  run(f, &c);
  expect_fail(f, "actor", "proc.call('fill'): argument 2: expected number, got string");
  pk = begin(f, &c, "__actor_call", 3);
  pack_str(pk, "k");
  pack_str(pk, "too_many");
  pack_tensor(pk, 7);
  run(f, &c);
  expect_fail(f, "actor", "proc.call('iota'): expected 1 to 2 arguments, got 3 (signature \"tn?\")");
  pk = begin(f, &c, "__actor_call", 3);
  pack_str(pk, "k");
  pack_str(pk, "go");
  pack_tensor(pk, 99);
  run(f, &c);
  expect_fail(f, "actor", "tensor 99 does not exist on this proc");
  pk = begin(f, &c, "__actor_stop", 1);
  pack_str(pk, "k");
  run(f, &c);
  assert_true(ok_values(f)->via.array.ptr[0].via.boolean);
  assert_int_equal(f->x.reg.ntensors, 1); /* the actor's own went with it */
}

/* ---- cartpole ------------------------------------------------------------------------ */

static void new_tensor(fix_t *f, uint64_t id, const char *dtype, int ndim, const int *shape) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, "__tensor_new", 3);
  msgpack_pack_uint64(pk, id);
  pack_str(pk, dtype);
  msgpack_pack_array(pk, (size_t)ndim);
  for (int i = 0; i < ndim; i++) msgpack_pack_int(pk, shape[i]);
  run(f, &c);
  ok_values(f);
}

static void cp_step(fix_t *f, int seed) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, "cartpole_step", 4);
  pack_tensor(pk, 1);
  pack_tensor(pk, 2);
  pack_tensor(pk, 3);
  msgpack_pack_int(pk, seed);
  run(f, &c);
}

static void test_cartpole(void **state) {
  fix_t *f = *state;
  call_t c;
  msgpack_packer *pk = begin(f, &c, "__load", 1);
  pack_str(pk, "cartpole");
  run(f, &c);
  ok_values(f);
  const int s2[] = {3, 5}, s1[] = {3};
  new_tensor(f, 1, "f64", 2, s2);
  new_tensor(f, 2, "i32", 1, s1);
  new_tensor(f, 3, "u8", 1, s1);
  double *st = mn_tensor_get(&f->x.reg, 1)->data;
  int32_t *act = mn_tensor_get(&f->x.reg, 2)->data;
  uint8_t *done = mn_tensor_get(&f->x.reg, 3)->data;
  /* env 0 at rest, pushed right; env 1 about to fall; env 2 on its last step. */
  act[0] = 1;
  st[5 + 2] = 0.2094;
  st[5 + 3] = 0.5;
  st[10 + 4] = 199;
  cp_step(f, 42);
  assert_int_equal(ok_values(f)->via.array.ptr[0].via.u64, 2);
  /* Gym's CartPole-v0 from the zero state with action 1. */
  assert_true(fabs(st[0]) < 1e-12);
  assert_true(fabs(st[1] - 0.1951219512195122) < 1e-9);
  assert_true(fabs(st[2]) < 1e-12);
  assert_true(fabs(st[3] + 0.2926829268292683) < 1e-9);
  assert_true(st[4] == 1.0);
  assert_int_equal(done[0], 0);
  assert_int_equal(done[1], 1); /* fell: reset to a fresh start */
  assert_int_equal(done[2], 2); /* reached the 200-step limit */
  for (int e = 1; e < 3; e++) {
    for (int k = 0; k < 4; k++) assert_true(fabs(st[5 * e + k]) <= 0.05);
    assert_true(st[5 * e + 4] == 0.0);
  }
  pk = begin(f, &c, "cartpole_reset", 2);
  pack_tensor(pk, 2);
  msgpack_pack_int(pk, 1);
  run(f, &c);
  expect_fail(f, "kernel", "state must be an f64 tensor of shape {N, 5}");
}

int main(void) {
  if (mn_actor_register() != 0) return 1;
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_define_spawn_call, setup, teardown),
    cmocka_unit_test_setup_teardown(test_errors_keep_the_state_alive, setup, teardown),
    cmocka_unit_test_setup_teardown(test_memory_limit, setup, teardown),
    cmocka_unit_test_setup_teardown(test_kernels_from_lua, setup, teardown),
    cmocka_unit_test_setup_teardown(test_cartpole, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
