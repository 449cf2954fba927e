/*
 * test_exec.c - unit tests for host/worker/exec.c (the proc's CALL executor)
 * and host/worker/registry.c (kernel libraries and tensors).
 *
 * CALL frames are packed here and handed to mn_exec_frame() exactly as the
 * proc's I/O thread would (the body, without the 4-byte length prefix); the
 * RESULT / ERROR frames it leaves in x->out are decoded and checked. The
 * "basic" (and "faulty") kernel libraries are loaded from
 * $MONARCH_PREFIX/lib/monarch, default build/lib/monarch (tests run from the
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
#include <unistd.h>

#include "exec.h"
#include "registry.h"
#include "scratch.h"
#include "sig.h"
#include "wire.h"

/* ---- fixture -------------------------------------------------------------- */

typedef struct {
  mn_exec_t x;
  atomic_int cancel;
  uint64_t seq; /* last sequence number sent */
} fix_t;

static const char *prefix(void) {
  const char *p = getenv("MONARCH_PREFIX");
  return p && *p ? p : "build";
}

static int setup(void **state) {
  fix_t *f = calloc(1, sizeof(*f));
  if (f == NULL) return -1;
  atomic_init(&f->cancel, 0);
  if (mn_exec_init(&f->x, prefix(), 3, 8, &f->cancel) != 0) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fix_t *f = *state;
  mn_exec_close(&f->x);
  free(f);
  return 0;
}

/* ---- packing CALLs ----------------------------------------------------------- */

typedef struct {
  mn_buf_t b;
  msgpack_packer pk;
  size_t start;
} call_t;

/* Starts [20, seq, name, [ ...nargs ]]; the caller packs the arguments. */
static msgpack_packer *call_begin(call_t *c, uint64_t seq, const char *name, uint32_t nargs) {
  mn_buf_init(&c->b);
  msgpack_packer_init(&c->pk, &c->b, mn_buf_write_cb);
  c->start = mn_frame_begin(&c->b);
  msgpack_pack_array(&c->pk, 4);
  msgpack_pack_int(&c->pk, MN_MSG_CALL);
  msgpack_pack_uint64(&c->pk, seq);
  mn_pack_cstr(&c->pk, name);
  msgpack_pack_array(&c->pk, nargs);
  return &c->pk;
}

/* Frames the call, checks the frame is well formed, and executes its body. */
static int call_run(mn_exec_t *x, call_t *c) {
  const char *body;
  mn_frame_end(&c->b, c->start);
  int64_t n = mn_frame_peek(c->b.data, c->b.len, MN_MAX_FRAME, &body);
  assert_int_equal(n, (int64_t)(c->b.len - MN_FRAME_HEADER));
  int rc = mn_exec_frame(x, body, (size_t)n);
  /* A payload by reference (a fetch) goes on the wire right after the frame's
   * bytes: append it, as the proc's writev would. */
  if (x->ref_len > 0) {
    assert_int_equal(mn_buf_append(&x->out, x->ref_ptr, x->ref_len), 0);
    x->ref_len = 0;
  }
  mn_buf_free(&c->b);
  return rc;
}

static void pack_tensor(msgpack_packer *pk, uint64_t id) {
  char be[8];
  for (int i = 0; i < 8; i++) be[i] = (char)(id >> (56 - 8 * i));
  msgpack_pack_ext(pk, 8, 1);
  msgpack_pack_ext_body(pk, be, 8);
}

static void pack_bin(msgpack_packer *pk, const void *p, size_t n) {
  msgpack_pack_bin(pk, n);
  msgpack_pack_bin_body(pk, p, n);
}

/* ---- reading replies ---------------------------------------------------------- */

typedef struct {
  char *body;
  msgpack_zone zone;
  msgpack_object obj;
} reply_t;

/* Takes exactly one frame out of x->out, which must then be empty. */
static void take_reply(mn_exec_t *x, reply_t *r) {
  const char *body;
  char err[256] = "";
  assert_true(x->out.len > 0);
  int64_t n = mn_frame_peek(x->out.data, x->out.len, MN_MAX_FRAME, &body);
  assert_true(n > 0);
  assert_int_equal(x->out.len, MN_FRAME_HEADER + (size_t)n);
  r->body = malloc((size_t)n);
  assert_non_null(r->body);
  memcpy(r->body, body, (size_t)n);
  mn_buf_consume(&x->out, x->out.len);
  assert_true(msgpack_zone_init(&r->zone, 4096));
  int rc = mn_decode(r->body, (size_t)n, &r->zone, &r->obj, err, sizeof(err));
  if (rc != 0) print_error("reply does not decode: %s\n", err);
  assert_int_equal(rc, 0);
}

static void reply_free(reply_t *r) {
  msgpack_zone_destroy(&r->zone);
  free(r->body);
}

/* Checks r is [RESULT, seq, true, [values]]; returns the values array. */
static const msgpack_object *expect_ok(reply_t *r, uint64_t seq) {
  const msgpack_object *o = &r->obj;
  assert_int_equal(mn_msg_type(o), MN_MSG_RESULT);
  assert_int_equal(o->via.array.size, 4);
  uint64_t s;
  assert_int_equal(mn_get_u64(o, 1, &s), 0);
  assert_int_equal(s, seq);
  assert_int_equal(o->via.array.ptr[2].type, MSGPACK_OBJECT_BOOLEAN);
  if (!o->via.array.ptr[2].via.boolean) {
    const msgpack_object *m = mn_map_get(&o->via.array.ptr[3], "message");
    print_error("call %llu failed: %.*s\n", (unsigned long long)seq, m ? (int)m->via.str.size : 1,
                m ? m->via.str.ptr : "?");
  }
  assert_true(o->via.array.ptr[2].via.boolean);
  assert_int_equal(o->via.array.ptr[3].type, MSGPACK_OBJECT_ARRAY);
  return &o->via.array.ptr[3];
}

/* Checks r is [RESULT, seq, false, {kind, message, kernel}] with the given
 * kind and a message containing `needle` (and `needle2` when not NULL). */
static void expect_fail(reply_t *r, uint64_t seq, const char *kind, const char *kernel,
                        const char *needle, const char *needle2) {
  const msgpack_object *o = &r->obj;
  assert_int_equal(mn_msg_type(o), MN_MSG_RESULT);
  assert_int_equal(o->via.array.size, 4);
  uint64_t s;
  assert_int_equal(mn_get_u64(o, 1, &s), 0);
  assert_int_equal(s, seq);
  assert_int_equal(o->via.array.ptr[2].type, MSGPACK_OBJECT_BOOLEAN);
  assert_false(o->via.array.ptr[2].via.boolean);
  const msgpack_object *map = &o->via.array.ptr[3];
  assert_int_equal(map->type, MSGPACK_OBJECT_MAP);
  const msgpack_object *k = mn_map_get(map, "kind");
  const msgpack_object *m = mn_map_get(map, "message");
  const msgpack_object *kn = mn_map_get(map, "kernel");
  assert_non_null(k);
  assert_non_null(m);
  assert_non_null(kn);
  assert_int_equal(k->type, MSGPACK_OBJECT_STR);
  assert_int_equal(m->type, MSGPACK_OBJECT_STR);
  assert_int_equal(kn->type, MSGPACK_OBJECT_STR);
  char kbuf[64], mbuf[MN_MAX_ERRMSG + 1];
  snprintf(kbuf, sizeof(kbuf), "%.*s", (int)k->via.str.size, k->via.str.ptr);
  snprintf(mbuf, sizeof(mbuf), "%.*s", (int)m->via.str.size, m->via.str.ptr);
  if (strcmp(kbuf, kind) != 0 || (needle && !strstr(mbuf, needle)) || (needle2 && !strstr(mbuf, needle2)))
    print_error("call %llu: kind \"%s\", message \"%s\"; wanted kind \"%s\" with \"%s\"%s%s\n",
                (unsigned long long)seq, kbuf, mbuf, kind, needle ? needle : "",
                needle2 ? " and " : "", needle2 ? needle2 : "");
  assert_string_equal(kbuf, kind);
  assert_true(strlen(mbuf) > 0);
  if (needle) assert_non_null(strstr(mbuf, needle));
  if (needle2) assert_non_null(strstr(mbuf, needle2));
  if (kernel) {
    assert_int_equal(kn->via.str.size, strlen(kernel));
    assert_memory_equal(kn->via.str.ptr, kernel, strlen(kernel));
  }
}

/* Checks an [ERROR, code, message] frame; returns nothing. */
static void expect_error_frame(mn_exec_t *x, int code, const char *needle) {
  reply_t r;
  take_reply(x, &r);
  assert_int_equal(mn_msg_type(&r.obj), MN_MSG_ERROR);
  assert_int_equal(r.obj.via.array.size, 3);
  int64_t c;
  const char *s;
  size_t sl;
  assert_int_equal(mn_get_i64(&r.obj, 1, &c), 0);
  assert_int_equal(c, code);
  assert_int_equal(mn_get_str(&r.obj, 2, &s, &sl), 0);
  assert_true(sl > 0);
  if (needle) {
    char buf[512];
    snprintf(buf, sizeof(buf), "%.*s", (int)sl, s);
    if (!strstr(buf, needle)) print_error("ERROR message \"%s\" lacks \"%s\"\n", buf, needle);
    assert_non_null(strstr(buf, needle));
  }
  reply_free(&r);
}

/* ---- call shorthands ------------------------------------------------------------ */

/* Each runs one call with the next sequence number and leaves its reply in r. */
static uint64_t call0(fix_t *f, const char *name, reply_t *r) {
  call_t c;
  uint64_t seq = ++f->seq;
  call_begin(&c, seq, name, 0);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, r);
  return seq;
}

static uint64_t call_str(fix_t *f, const char *name, const char *arg, reply_t *r) {
  call_t c;
  uint64_t seq = ++f->seq;
  mn_pack_cstr(call_begin(&c, seq, name, 1), arg);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, r);
  return seq;
}

static uint64_t call_t1(fix_t *f, const char *name, uint64_t tid, reply_t *r) {
  call_t c;
  uint64_t seq = ++f->seq;
  pack_tensor(call_begin(&c, seq, name, 1), tid);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, r);
  return seq;
}

static uint64_t call_id(fix_t *f, const char *name, uint64_t id, reply_t *r) {
  call_t c;
  uint64_t seq = ++f->seq;
  msgpack_pack_uint64(call_begin(&c, seq, name, 1), id);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, r);
  return seq;
}

static void load_ok(fix_t *f, const char *lib) {
  reply_t r;
  uint64_t seq = call_str(f, "__load", lib, &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 2);
  assert_int_equal(v->via.array.ptr[0].type, MSGPACK_OBJECT_STR);
  assert_int_equal(v->via.array.ptr[0].via.str.size, strlen(lib));
  assert_memory_equal(v->via.array.ptr[0].via.str.ptr, lib, strlen(lib));
  assert_int_equal(v->via.array.ptr[1].type, MSGPACK_OBJECT_POSITIVE_INTEGER);
  assert_true(v->via.array.ptr[1].via.u64 > 0);
  reply_free(&r);
}

/* __tensor_new(id, dtype, shape) */
static uint64_t tensor_new(fix_t *f, uint64_t id, const char *dtype, int ndim, const int64_t *shape,
                           reply_t *r) {
  call_t c;
  uint64_t seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "__tensor_new", 3);
  msgpack_pack_uint64(pk, id);
  mn_pack_cstr(pk, dtype);
  msgpack_pack_array(pk, (size_t)ndim);
  for (int i = 0; i < ndim; i++) msgpack_pack_int64(pk, shape[i]);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, r);
  return seq;
}

static void tensor_new_ok(fix_t *f, uint64_t id, const char *dtype, int ndim, const int64_t *shape) {
  reply_t r;
  uint64_t seq = tensor_new(f, id, dtype, ndim, shape, &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 0);
  reply_free(&r);
}

static double as_number(const msgpack_object *o) {
  if (o->type == MSGPACK_OBJECT_FLOAT64 || o->type == MSGPACK_OBJECT_FLOAT32) return o->via.f64;
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return (double)o->via.u64;
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) return (double)o->via.i64;
  fail_msg("not a number: type %d", (int)o->type);
  return 0;
}

/* ---- library loading ---------------------------------------------------------- */

static void test_load(void **state) {
  fix_t *f = *state;
  reply_t r;
  /* Before anything is loaded, a kernel is unknown and the hint says why. */
  uint64_t seq = call0(f, "noop", &r);
  expect_fail(&r, seq, "unknown_kernel", "noop", "noop", "no library loaded");
  reply_free(&r);

  load_ok(f, "basic");
  assert_int_equal(f->x.reg.nlibs, 1);
  /* Loading again is a no-op that answers the same. */
  load_ok(f, "basic");
  assert_int_equal(f->x.reg.nlibs, 1);

  /* Unknown library: bad_args naming it. */
  seq = call_str(f, "__load", "no_such_library_xyz", &r);
  expect_fail(&r, seq, "bad_args", "__load", "no_such_library_xyz", NULL);
  reply_free(&r);
  /* Bad names. */
  seq = call_str(f, "__load", "", &r);
  expect_fail(&r, seq, "bad_args", "__load", NULL, NULL);
  reply_free(&r);
  {
    char longname[MN_MAX_NAME + 2];
    memset(longname, 'a', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    seq = call_str(f, "__load", longname, &r);
    expect_fail(&r, seq, "bad_args", "__load", NULL, NULL);
    reply_free(&r);
  }
  seq = call_id(f, "__load", 5, &r);
  expect_fail(&r, seq, "bad_args", "__load", NULL, NULL);
  reply_free(&r);
  /* A path that is a file but not a kernel library. */
  seq = call_str(f, "__load", "/etc/hostname", &r);
  expect_fail(&r, seq, "bad_args", "__load", NULL, NULL);
  reply_free(&r);
  assert_int_equal(f->x.reg.nlibs, 1);

  /* With a library loaded, an unknown kernel has no "load first" hint. */
  seq = call0(f, "no_such_kernel", &r);
  expect_fail(&r, seq, "unknown_kernel", "no_such_kernel", "no_such_kernel", NULL);
  {
    const msgpack_object *m = mn_map_get(&r.obj.via.array.ptr[3], "message");
    char buf[512];
    snprintf(buf, sizeof(buf), "%.*s", (int)m->via.str.size, m->via.str.ptr);
    assert_null(strstr(buf, "no library loaded"));
  }
  reply_free(&r);

  /* __kernels lists what is loaded. */
  seq = call0(f, "__kernels", &r);
  const msgpack_object *v = expect_ok(&r, seq);
  int seen_noop = 0, seen_echo = 0;
  for (uint32_t i = 0; i < v->via.array.size; i++) {
    const msgpack_object *k = &v->via.array.ptr[i];
    assert_int_equal(k->type, MSGPACK_OBJECT_STR);
    if (k->via.str.size == 4 && memcmp(k->via.str.ptr, "noop", 4) == 0) seen_noop++;
    if (k->via.str.size == 4 && memcmp(k->via.str.ptr, "echo", 4) == 0) seen_echo++;
  }
  assert_int_equal(seen_noop, 1);
  assert_int_equal(seen_echo, 1);
  assert_int_equal(v->via.array.size, (uint32_t)f->x.reg.libs[0]->count);
  reply_free(&r);

  /* An unknown built-in. */
  seq = call0(f, "__nonsense", &r);
  expect_fail(&r, seq, "bad_args", "__nonsense", "__nonsense", NULL);
  reply_free(&r);
}

/* ---- kernels and argument checking ---------------------------------------------- */

static void test_noop_echo(void **state) {
  fix_t *f = *state;
  reply_t r;
  load_ok(f, "basic");
  uint64_t seq = call0(f, "noop", &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 0);
  reply_free(&r);

  /* echo returns every kind of value unchanged. */
  call_t c;
  static const char binv[] = {0, 1, (char)0xfe};
  seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "echo", 10);
  msgpack_pack_int64(pk, 42);
  msgpack_pack_int64(pk, -7);
  msgpack_pack_int64(pk, INT64_MIN);
  msgpack_pack_double(pk, 2.5);
  mn_pack_cstr(pk, "hello");
  msgpack_pack_nil(pk);
  msgpack_pack_true(pk);
  msgpack_pack_false(pk);
  pack_bin(pk, binv, sizeof(binv));
  mn_pack_cstr(pk, "");
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 10);
  const msgpack_object *e = v->via.array.ptr;
  assert_int_equal(e[0].type, MSGPACK_OBJECT_POSITIVE_INTEGER);
  assert_int_equal(e[0].via.u64, 42);
  assert_int_equal(e[1].type, MSGPACK_OBJECT_NEGATIVE_INTEGER);
  assert_int_equal(e[1].via.i64, -7);
  assert_int_equal(e[2].type, MSGPACK_OBJECT_NEGATIVE_INTEGER);
  assert_true(e[2].via.i64 == INT64_MIN);
  assert_int_equal(e[3].type, MSGPACK_OBJECT_FLOAT64);
  assert_true(e[3].via.f64 == 2.5);
  assert_int_equal(e[4].type, MSGPACK_OBJECT_STR);
  assert_int_equal(e[4].via.str.size, 5);
  assert_memory_equal(e[4].via.str.ptr, "hello", 5);
  assert_int_equal(e[5].type, MSGPACK_OBJECT_NIL);
  assert_int_equal(e[6].type, MSGPACK_OBJECT_BOOLEAN);
  assert_true(e[6].via.boolean);
  assert_int_equal(e[7].type, MSGPACK_OBJECT_BOOLEAN);
  assert_false(e[7].via.boolean);
  assert_int_equal(e[8].type, MSGPACK_OBJECT_BIN);
  assert_int_equal(e[8].via.bin.size, sizeof(binv));
  assert_memory_equal(e[8].via.bin.ptr, binv, sizeof(binv));
  assert_int_equal(e[9].type, MSGPACK_OBJECT_STR);
  assert_int_equal(e[9].via.str.size, 0);
  reply_free(&r);

  /* echo with no arguments returns nothing. */
  seq = call0(f, "echo", &r);
  v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 0);
  reply_free(&r);

  /* rank reports the rank and world given to mn_exec_init. */
  seq = call0(f, "rank", &r);
  v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 2);
  assert_int_equal(as_number(&v->via.array.ptr[0]), 3);
  assert_int_equal(as_number(&v->via.array.ptr[1]), 8);
  reply_free(&r);

  /* A table cannot be passed to a kernel. */
  seq = ++f->seq;
  pk = call_begin(&c, seq, "echo", 1);
  msgpack_pack_array(pk, 0);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "echo", "argument 1", NULL);
  reply_free(&r);
  /* Nor an ext value that is not a tensor handle. */
  seq = ++f->seq;
  pk = call_begin(&c, seq, "echo", 2);
  msgpack_pack_nil(pk);
  msgpack_pack_ext(pk, 2, 9);
  msgpack_pack_ext_body(pk, "ab", 2);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "echo", "argument 2", NULL);
  reply_free(&r);
}

static void test_bad_args(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  load_ok(f, "basic");
  int64_t shape[1] = {4};
  tensor_new_ok(f, 7, "f32", 1, shape);

  /* Wrong count. */
  uint64_t seq = call_t1(f, "fill", 7, &r);
  expect_fail(&r, seq, "bad_args", "fill", "expected 2 arguments", "got 1");
  reply_free(&r);
  seq = call_str(f, "noop", "extra", &r);
  expect_fail(&r, seq, "bad_args", "noop", "expected 0 arguments", NULL);
  reply_free(&r);
  seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "sum", 2);
  pack_tensor(pk, 7);
  pack_tensor(pk, 7);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "sum", "expected 1 argument", NULL);
  reply_free(&r);
  /* Optional arguments: iota takes 1 to 2. */
  seq = ++f->seq;
  pk = call_begin(&c, seq, "iota", 3);
  pack_tensor(pk, 7);
  msgpack_pack_int(pk, 1);
  msgpack_pack_int(pk, 2);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "iota", "expected 1 to 2 arguments", NULL);
  reply_free(&r);
  seq = call_t1(f, "iota", 7, &r);
  expect_ok(&r, seq);
  reply_free(&r);

  /* Wrong types. */
  seq = call_str(f, "sum", "not a tensor", &r);
  expect_fail(&r, seq, "bad_args", "sum", "argument 1", "expected tensor");
  reply_free(&r);
  seq = call_id(f, "sum", 7, &r); /* a bare integer is not a tensor */
  expect_fail(&r, seq, "bad_args", "sum", "argument 1", "expected tensor");
  reply_free(&r);
  seq = ++f->seq;
  pk = call_begin(&c, seq, "fill", 2);
  pack_tensor(pk, 7);
  mn_pack_cstr(pk, "1.5");
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "fill", "argument 2", "expected number");
  reply_free(&r);
  seq = ++f->seq;
  pk = call_begin(&c, seq, "sleep", 1);
  msgpack_pack_true(pk);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "sleep", "argument 1", "expected number");
  reply_free(&r);
  /* An integer where a number is wanted is converted, not refused. */
  seq = ++f->seq;
  pk = call_begin(&c, seq, "fill", 2);
  pack_tensor(pk, 7);
  msgpack_pack_int(pk, 3);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_ok(&r, seq);
  reply_free(&r);

  /* Too many arguments for the protocol, and too long a name. */
  seq = ++f->seq;
  pk = call_begin(&c, seq, "echo", MN_MAX_ARGS + 1);
  for (int i = 0; i < MN_MAX_ARGS + 1; i++) msgpack_pack_int(pk, i);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "echo", "MN_MAX_ARGS", NULL);
  reply_free(&r);
  seq = ++f->seq;
  pk = call_begin(&c, seq, "echo", MN_MAX_ARGS);
  for (int i = 0; i < MN_MAX_ARGS; i++) msgpack_pack_int(pk, i);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  assert_int_equal(expect_ok(&r, seq)->via.array.size, MN_MAX_ARGS);
  reply_free(&r);
  {
    char longname[MN_MAX_NAME + 2];
    memset(longname, 'k', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    seq = call0(f, longname, &r);
    expect_fail(&r, seq, "bad_args", NULL, "MN_MAX_NAME", NULL);
    reply_free(&r);
  }

  /* A kernel that fails reports kind "kernel" with its own message. */
  seq = ++f->seq;
  pk = call_begin(&c, seq, "sleep", 1);
  msgpack_pack_double(pk, -1.0);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "kernel", "sleep", "seconds must be", NULL);
  reply_free(&r);
}

static void test_cancel(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  load_ok(f, "basic");
  atomic_store(&f->cancel, 1);
  uint64_t seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "sleep", 1);
  msgpack_pack_double(pk, 30.0);
  assert_int_equal(call_run(&f->x, &c), 0); /* returns promptly, not after 30 s */
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "cancelled", "sleep", "cancelled", NULL); /* a stopped kernel fails as cancelled, not as its own error */
  reply_free(&r);
  atomic_store(&f->cancel, 0);
  seq = ++f->seq;
  pk = call_begin(&c, seq, "sleep", 1);
  msgpack_pack_double(pk, 0.0);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_ok(&r, seq);
  reply_free(&r);
}

static void test_faulty_fail(void **state) {
  fix_t *f = *state;
  reply_t r;
  load_ok(f, "faulty");
  uint64_t seq = call_str(f, "fail", "exactly this message", &r);
  expect_fail(&r, seq, "kernel", "fail", "exactly this message", NULL);
  {
    const msgpack_object *m = mn_map_get(&r.obj.via.array.ptr[3], "message");
    assert_int_equal(m->via.str.size, strlen("exactly this message"));
  }
  reply_free(&r);
  /* A very long kernel message is cut to MN_MAX_ERRMSG, not overflowed. */
  char *huge = malloc(5000);
  assert_non_null(huge);
  memset(huge, 'm', 4999);
  huge[4999] = '\0';
  seq = call_str(f, "fail", huge, &r);
  free(huge);
  expect_fail(&r, seq, "kernel", "fail", "mmmm", NULL);
  {
    const msgpack_object *m = mn_map_get(&r.obj.via.array.ptr[3], "message");
    assert_true(m->via.str.size < MN_MAX_ERRMSG);
  }
  reply_free(&r);
  /* An 'i' argument takes only integral values: a fractional, huge or NaN
   * number is refused before the kernel runs (here exit(code), which would
   * end this test program if it ran). */
  static const double not_ints[] = {2.5, -0.5, 1e300, -1e300, 9.3e18};
  for (size_t i = 0; i < sizeof(not_ints) / sizeof(not_ints[0]) + 2; i++) {
    call_t c;
    seq = ++f->seq;
    msgpack_packer *pk = call_begin(&c, seq, "exit", 1);
    if (i < sizeof(not_ints) / sizeof(not_ints[0])) msgpack_pack_double(pk, not_ints[i]);
    else if (i == sizeof(not_ints) / sizeof(not_ints[0])) msgpack_pack_double(pk, NAN);
    else mn_pack_cstr(pk, "0");
    assert_int_equal(call_run(&f->x, &c), 0);
    take_reply(&f->x, &r);
    expect_fail(&r, seq, "bad_args", "exit", "argument 1", "expected integer");
    reply_free(&r);
  }
  /* The proc carries on. */
  seq = call0(f, "__kernels", &r);
  expect_ok(&r, seq);
  reply_free(&r);
}

/* ---- tensors ------------------------------------------------------------------- */

static void test_tensors(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  load_ok(f, "basic");
  int64_t shape[1] = {4};
  tensor_new_ok(f, 7, "f32", 1, shape);
  assert_int_equal(f->x.reg.ntensors, 1);
  assert_int_equal(f->x.reg.tensor_bytes, 16);

  /* A new tensor is zeroed. */
  uint64_t seq = call_t1(f, "sum", 7, &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 1);
  assert_true(as_number(&v->via.array.ptr[0]) == 0.0);
  reply_free(&r);

  /* fill then sum. */
  seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "fill", 2);
  pack_tensor(pk, 7);
  msgpack_pack_double(pk, 2.5);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  assert_int_equal(expect_ok(&r, seq)->via.array.size, 0);
  reply_free(&r);
  seq = call_t1(f, "sum", 7, &r);
  v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 1);
  assert_true(as_number(&v->via.array.ptr[0]) == 4 * 2.5);
  reply_free(&r);

  /* echo gives a tensor back as its id. */
  seq = call_t1(f, "echo", 7, &r);
  v = expect_ok(&r, seq);
  assert_int_equal(as_number(&v->via.array.ptr[0]), 7);
  reply_free(&r);

  /* __tensor_fetch: the raw bytes, 16 of them. Ids work bare or as handles. */
  seq = call_id(f, "__tensor_fetch", 7, &r);
  v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 1);
  assert_int_equal(v->via.array.ptr[0].type, MSGPACK_OBJECT_BIN);
  assert_int_equal(v->via.array.ptr[0].via.bin.size, 16);
  float got[4];
  memcpy(got, v->via.array.ptr[0].via.bin.ptr, 16);
  for (int i = 0; i < 4; i++) assert_true(got[i] == 2.5f);
  reply_free(&r);
  seq = call_t1(f, "__tensor_fetch", 7, &r);
  assert_int_equal(expect_ok(&r, seq)->via.array.ptr[0].via.bin.size, 16);
  reply_free(&r);

  /* __tensor_put of the right size, then sum sees it. */
  float put[5] = {1, 2, 3, 4.5f, 99}; /* the fifth only for the too-long put below */
  seq = ++f->seq;
  pk = call_begin(&c, seq, "__tensor_put", 2);
  msgpack_pack_uint64(pk, 7);
  pack_bin(pk, put, 16);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_ok(&r, seq);
  reply_free(&r);
  seq = call_t1(f, "sum", 7, &r);
  assert_true(as_number(&expect_ok(&r, seq)->via.array.ptr[0]) == 10.5);
  reply_free(&r);

  /* ...and of the wrong size, or without data, is refused and changes nothing. */
  seq = ++f->seq;
  pk = call_begin(&c, seq, "__tensor_put", 2);
  msgpack_pack_uint64(pk, 7);
  pack_bin(pk, put, 15);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_put", "15 bytes", "16 bytes");
  reply_free(&r);
  seq = ++f->seq;
  pk = call_begin(&c, seq, "__tensor_put", 2);
  msgpack_pack_uint64(pk, 7);
  pack_bin(pk, put, 17);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_put", NULL, NULL);
  reply_free(&r);
  seq = call_id(f, "__tensor_put", 7, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_put", NULL, NULL);
  reply_free(&r);
  seq = call_t1(f, "sum", 7, &r);
  assert_true(as_number(&expect_ok(&r, seq)->via.array.ptr[0]) == 10.5);
  reply_free(&r);

  /* __info counts tensors. */
  seq = call0(f, "__info", &r);
  v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 6);
  assert_int_equal(as_number(&v->via.array.ptr[0]), 3);        /* rank */
  assert_int_equal(as_number(&v->via.array.ptr[1]), 8);        /* world */
  assert_int_equal(as_number(&v->via.array.ptr[2]), getpid()); /* pid */
  assert_int_equal(v->via.array.ptr[3].type, MSGPACK_OBJECT_STR);
  assert_int_equal(as_number(&v->via.array.ptr[4]), 1);
  assert_int_equal(as_number(&v->via.array.ptr[5]), 16);
  reply_free(&r);

  /* Free it: true once, then false; using it after is bad_args. */
  seq = call_t1(f, "__tensor_free", 7, &r);
  v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 1);
  assert_int_equal(v->via.array.ptr[0].type, MSGPACK_OBJECT_BOOLEAN);
  assert_true(v->via.array.ptr[0].via.boolean);
  reply_free(&r);
  assert_int_equal(f->x.reg.ntensors, 0);
  assert_int_equal(f->x.reg.tensor_bytes, 0);
  seq = call_id(f, "__tensor_free", 7, &r);
  v = expect_ok(&r, seq);
  assert_false(v->via.array.ptr[0].via.boolean);
  reply_free(&r);
  seq = call_t1(f, "sum", 7, &r);
  expect_fail(&r, seq, "bad_args", "sum", "does not exist", NULL);
  reply_free(&r);
  seq = ++f->seq;
  pk = call_begin(&c, seq, "fill", 2);
  pack_tensor(pk, 7);
  msgpack_pack_double(pk, 1.0);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "fill", "argument 1", "does not exist");
  reply_free(&r);
  seq = call_id(f, "__tensor_fetch", 7, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_fetch", "does not exist", NULL);
  reply_free(&r);

  /* The id can be used again after the free. */
  tensor_new_ok(f, 7, "f64", 1, shape);
  seq = call_id(f, "__tensor_fetch", 7, &r);
  assert_int_equal(expect_ok(&r, seq)->via.array.ptr[0].via.bin.size, 32);
  reply_free(&r);

  /* A large id survives the 8-byte big-endian handle. */
  uint64_t big = 0x0102030405060708ull;
  int64_t two[2] = {2, 3};
  tensor_new_ok(f, big, "i32", 2, two);
  seq = call_t1(f, "echo", big, &r);
  v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.ptr[0].type, MSGPACK_OBJECT_POSITIVE_INTEGER);
  assert_true(v->via.array.ptr[0].via.u64 == big);
  reply_free(&r);
  assert_non_null(mn_tensor_get(&f->x.reg, big));
  assert_int_equal(mn_tensor_get(&f->x.reg, big)->numel, 6);
}

static void test_tensor_new_errors(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  int64_t shape[MK_MAX_DIMS + 1];
  for (int i = 0; i <= MK_MAX_DIMS; i++) shape[i] = 1;

  tensor_new_ok(f, 1, "u8", 1, shape);
  /* Duplicate id. */
  uint64_t seq = tensor_new(f, 1, "u8", 1, shape, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", "already exists", NULL);
  reply_free(&r);
  /* Unknown dtype. */
  seq = tensor_new(f, 2, "f33", 1, shape, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", "f33", NULL);
  reply_free(&r);
  /* Too many dimensions; exactly MK_MAX_DIMS is fine. */
  seq = tensor_new(f, 2, "f32", MK_MAX_DIMS + 1, shape, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", "MK_MAX_DIMS", NULL);
  reply_free(&r);
  tensor_new_ok(f, 2, "f32", MK_MAX_DIMS, shape);
  /* Negative and overflowing sizes. */
  int64_t neg[2] = {2, -1};
  seq = tensor_new(f, 3, "f32", 2, neg, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", "dimension 2", NULL);
  reply_free(&r);
  int64_t huge[3] = {INT64_C(1) << 30, INT64_C(1) << 30, INT64_C(1) << 30};
  seq = tensor_new(f, 3, "f32", 3, huge, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", NULL, NULL);
  reply_free(&r);
  /* Non-integer shape entries, a missing shape. */
  seq = ++f->seq;
  msgpack_packer *pk = call_begin(&c, seq, "__tensor_new", 3);
  msgpack_pack_uint64(pk, 3);
  mn_pack_cstr(pk, "f32");
  msgpack_pack_array(pk, 2);
  msgpack_pack_int(pk, 2);
  mn_pack_cstr(pk, "x");
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", "entry 2", NULL);
  reply_free(&r);
  seq = ++f->seq;
  pk = call_begin(&c, seq, "__tensor_new", 2);
  msgpack_pack_uint64(pk, 3);
  mn_pack_cstr(pk, "f32");
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, &r);
  expect_fail(&r, seq, "bad_args", "__tensor_new", "(id, dtype, shape)", NULL);
  reply_free(&r);
  /* A zero-sized and a 0-d tensor are fine. */
  int64_t zero[1] = {0};
  tensor_new_ok(f, 4, "f64", 1, zero);
  tensor_new_ok(f, 5, "f64", 0, NULL);
  assert_int_equal(mn_tensor_get(&f->x.reg, 4)->nbytes, 0);
  assert_int_equal(mn_tensor_get(&f->x.reg, 5)->numel, 1);
  assert_int_equal(f->x.reg.ntensors, 4);
}

/*
 * __tensor_fetch / __tensor_put / __tensor_free given no usable id must be
 * refused as bad_args, without claiming that some tensor "does not exist"
 * (no tensor was named). Run under valgrind, this also checks that no
 * uninitialized id is used to format the message.
 */
static void test_tensor_builtins_without_id(void **state) {
  fix_t *f = *state;
  static const char *const names[] = {"__tensor_fetch", "__tensor_put", "__tensor_free"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    for (int with_str = 0; with_str < 2; with_str++) {
      reply_t r;
      uint64_t seq = with_str ? call_str(f, names[i], "seven", &r) : call0(f, names[i], &r);
      expect_fail(&r, seq, "bad_args", names[i], NULL, NULL);
      const msgpack_object *m = mn_map_get(&r.obj.via.array.ptr[3], "message");
      char msg[512];
      snprintf(msg, sizeof(msg), "%.*s", (int)m->via.str.size, m->via.str.ptr);
      reply_free(&r);
      if (strstr(msg, "does not exist") != NULL)
        print_error("%s(%s): message \"%s\" names a tensor though no id was given\n", names[i],
                    with_str ? "\"seven\"" : "", msg);
      assert_null(strstr(msg, "does not exist"));
    }
  }
}

/* ---- sequencing and protocol errors ------------------------------------------------ */

static void test_sequence(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  load_ok(f, "basic"); /* seq 1 */
  uint64_t seq = call0(f, "noop", &r); /* seq 2 */
  expect_ok(&r, seq);
  reply_free(&r);

  /* Resends (seq <= last) run nothing: the caller replays their cached result. */
  for (uint64_t dup = 0; dup <= 2; dup++) {
    call_begin(&c, dup, "noop", 0);
    assert_int_equal(call_run(&f->x, &c), MN_EXEC_ALREADY_RAN);
    assert_int_equal(f->x.dup_seq, dup);
    assert_int_equal(f->x.out.len, 0);
  }
  assert_int_equal(f->x.last_seq, 2);

  /* A gap is a protocol violation. */
  call_begin(&c, 4, "noop", 0);
  assert_true(call_run(&f->x, &c) < 0);
  expect_error_frame(&f->x, MN_EPROTO, "gap");
  assert_int_equal(f->x.last_seq, 2); /* nothing ran */

  /* The next in order still runs. */
  seq = call0(f, "noop", &r); /* seq 3 */
  assert_int_equal(seq, 3);
  expect_ok(&r, seq);
  reply_free(&r);
  assert_int_equal(f->x.last_seq, 3);

  /* A failed call consumes its sequence number too. */
  seq = call0(f, "no_such_kernel", &r); /* seq 4 */
  expect_fail(&r, seq, "unknown_kernel", "no_such_kernel", NULL, NULL);
  reply_free(&r);
  assert_int_equal(f->x.last_seq, 4);
  call_begin(&c, 4, "noop", 0);
  assert_int_equal(call_run(&f->x, &c), 1); /* a resend: replayed by the caller, not run */
  assert_int_equal(f->x.out.len, 0);
}

static void test_protocol_errors(void **state) {
  fix_t *f = *state;
  reply_t r;
  mn_buf_t b;
  msgpack_packer pk;
  load_ok(f, "basic"); /* seq 1 */

  /* A message type the proc does not take. */
  mn_buf_init(&b);
  msgpack_packer_init(&pk, &b, mn_buf_write_cb);
  msgpack_pack_array(&pk, 2);
  msgpack_pack_int(&pk, MN_MSG_PING);
  msgpack_pack_int(&pk, 1);
  assert_true(mn_exec_frame(&f->x, b.data, b.len) < 0);
  expect_error_frame(&f->x, MN_EPROTO, "5");

  /* Malformed CALLs: seq not an integer, name not a string, args not an
   * array, wrong element count. */
  for (int variant = 0; variant < 5; variant++) {
    b.len = 0;
    msgpack_pack_array(&pk, variant == 3 ? 3 : (variant == 4 ? 5 : 4));
    msgpack_pack_int(&pk, MN_MSG_CALL);
    if (variant == 0) mn_pack_cstr(&pk, "2");
    else msgpack_pack_uint64(&pk, 2);
    if (variant == 1) msgpack_pack_int(&pk, 7);
    else mn_pack_cstr(&pk, "noop");
    if (variant == 2) mn_pack_cstr(&pk, "args");
    else if (variant != 3) msgpack_pack_array(&pk, 0);
    if (variant == 4) msgpack_pack_nil(&pk);
    int rc = mn_exec_frame(&f->x, b.data, b.len);
    if (rc >= 0) print_error("malformed CALL variant %d accepted\n", variant);
    assert_true(rc < 0);
    expect_error_frame(&f->x, MN_EPROTO, NULL);
  }
  assert_int_equal(f->x.last_seq, 1);

  /* Garbage that is not msgpack; the exec is still usable afterwards. */
  static const char garbage[] = {(char)0xc1, (char)0xc1, 0x00};
  int rc = mn_exec_frame(&f->x, garbage, sizeof(garbage));
  assert_int_equal(rc, MN_EMSGPACK);
  expect_error_frame(&f->x, MN_EMSGPACK, NULL);
  /* A truncated CALL. */
  call_t c;
  call_begin(&c, 2, "noop", 0);
  mn_frame_end(&c.b, c.start);
  rc = mn_exec_frame(&f->x, c.b.data + MN_FRAME_HEADER, c.b.len - MN_FRAME_HEADER - 1);
  mn_buf_free(&c.b);
  assert_int_equal(rc, MN_EMSGPACK);
  expect_error_frame(&f->x, MN_EMSGPACK, NULL);
  /* Trailing bytes. */
  b.len = 0;
  msgpack_pack_array(&pk, 1);
  msgpack_pack_int(&pk, MN_MSG_CALL);
  msgpack_pack_nil(&pk);
  assert_true(mn_exec_frame(&f->x, b.data, b.len) < 0);
  expect_error_frame(&f->x, MN_EMSGPACK, NULL);
  /* Too deep. */
  b.len = 0;
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, MN_MSG_CALL);
  msgpack_pack_uint64(&pk, 2);
  mn_pack_cstr(&pk, "echo");
  for (int i = 0; i < MN_MAX_DEPTH + 2; i++) msgpack_pack_array(&pk, 1);
  msgpack_pack_nil(&pk);
  rc = mn_exec_frame(&f->x, b.data, b.len);
  assert_int_equal(rc, MN_ELIMIT);
  expect_error_frame(&f->x, MN_ELIMIT, NULL);
  mn_buf_free(&b);
  assert_int_equal(f->x.last_seq, 1);

  /* The next valid call, with the next sequence number, works. */
  f->seq = 1;
  uint64_t seq = call0(f, "noop", &r);
  assert_int_equal(seq, 2);
  expect_ok(&r, seq);
  reply_free(&r);
  seq = call_t1(f, "echo", 1, &r); /* no tensor 1: still a clean bad_args */
  expect_fail(&r, seq, "bad_args", "echo", "does not exist", NULL);
  reply_free(&r);
}

/* ---- the registry, directly ------------------------------------------------------- */

static void test_registry_tensors(void **state) {
  (void)state;
  mn_registry_t reg;
  char err[256];
  mn_registry_init(&reg, prefix());
  assert_null(mn_tensor_get(&reg, 1));
  assert_int_equal(mn_tensor_free(&reg, 1), MN_ENOTFOUND);

  /* dtypes. */
  assert_int_equal(mn_dtype_parse("f32", 3), MK_F32);
  assert_int_equal(mn_dtype_parse("f64", 3), MK_F64);
  assert_int_equal(mn_dtype_parse("f16", 3), MK_F16);
  assert_int_equal(mn_dtype_parse("bf16", 4), MK_BF16);
  assert_int_equal(mn_dtype_parse("i32", 3), MK_I32);
  assert_int_equal(mn_dtype_parse("i64", 3), MK_I64);
  assert_int_equal(mn_dtype_parse("u8", 2), MK_U8);
  assert_int_equal(mn_dtype_parse("f32x", 3), MK_F32); /* only n bytes count */
  assert_int_equal(mn_dtype_parse("f3", 2), MN_EINVAL);
  assert_int_equal(mn_dtype_parse("f32x", 4), MN_EINVAL);
  assert_int_equal(mn_dtype_parse("", 0), MN_EINVAL);
  assert_int_equal(mn_dtype_parse("F32", 3), MN_EINVAL);
  for (int d = 0; d < MK_DTYPE_COUNT; d++)
    assert_int_equal(mn_dtype_parse(mn_dtype_name((mk_dtype_t)d), strlen(mn_dtype_name((mk_dtype_t)d))), d);
  assert_string_equal(mn_dtype_name((mk_dtype_t)99), "?");

  /* Bad shapes. */
  int64_t shape[MK_MAX_DIMS + 1];
  for (int i = 0; i <= MK_MAX_DIMS; i++) shape[i] = 2;
  err[0] = '\0';
  assert_null(mn_tensor_new(&reg, 1, MK_F32, MK_MAX_DIMS + 1, shape, err, sizeof(err)));
  assert_non_null(strstr(err, "MK_MAX_DIMS"));
  err[0] = '\0';
  assert_null(mn_tensor_new(&reg, 1, MK_F32, -1, shape, err, sizeof(err)));
  assert_true(strlen(err) > 0);
  shape[3] = -5;
  err[0] = '\0';
  assert_null(mn_tensor_new(&reg, 1, MK_F32, 4, shape, err, sizeof(err)));
  assert_non_null(strstr(err, "-5"));
  shape[3] = INT64_MAX;
  assert_null(mn_tensor_new(&reg, 1, MK_F32, 4, shape, err, sizeof(err)));
  shape[3] = 2;
  assert_int_equal(reg.ntensors, 0);
  assert_int_equal(reg.tensor_bytes, 0);

  mk_tensor_t *t = mn_tensor_new(&reg, 1, MK_F64, MK_MAX_DIMS, shape, err, sizeof(err));
  assert_non_null(t);
  assert_int_equal(t->numel, 256);
  assert_int_equal(t->nbytes, 256 * 8);
  assert_int_equal(t->ndim, MK_MAX_DIMS);
  assert_int_equal(t->device, -1);
  assert_int_equal(t->id, 1);
  assert_int_equal(((uintptr_t)t->data) % 64, 0);
  for (size_t i = 0; i < t->nbytes; i++) assert_int_equal(((unsigned char *)t->data)[i], 0);
  assert_ptr_equal(mn_tensor_get(&reg, 1), t);
  assert_null(mn_tensor_new(&reg, 1, MK_F32, 1, shape, err, sizeof(err)));
  assert_non_null(strstr(err, "already exists"));
  assert_int_equal(reg.ntensors, 1);

  /* Many new/free cycles: counts stay right and live tensors stay findable. */
  enum { CYCLES = 10000, KEEP = 37 };
  int64_t one[1] = {3};
  for (uint64_t id = 100; id < 100 + KEEP; id++)
    assert_non_null(mn_tensor_new(&reg, id, MK_I32, 1, one, err, sizeof(err)));
  assert_int_equal(reg.ntensors, 1 + KEEP);
  for (uint64_t i = 0; i < CYCLES; i++) {
    uint64_t id = 1000 + i;
    mk_tensor_t *u = mn_tensor_new(&reg, id, MK_U8, 1, one, err, sizeof(err));
    assert_non_null(u);
    assert_ptr_equal(mn_tensor_get(&reg, id), u);
    if (i % 3 == 0) {
      /* Also free and recreate one of the kept ones. */
      uint64_t k = 100 + i % KEEP;
      assert_int_equal(mn_tensor_free(&reg, k), 0);
      assert_null(mn_tensor_get(&reg, k));
      assert_non_null(mn_tensor_new(&reg, k, MK_I32, 1, one, err, sizeof(err)));
    }
    assert_int_equal(mn_tensor_free(&reg, id), 0);
    assert_int_equal(mn_tensor_free(&reg, id), MN_ENOTFOUND);
    assert_null(mn_tensor_get(&reg, id));
    assert_int_equal(reg.ntensors, 1 + KEEP);
  }
  assert_int_equal(reg.tensor_bytes, 256 * 8 + KEEP * 12);
  assert_ptr_equal(mn_tensor_get(&reg, 1), t);
  for (uint64_t id = 100; id < 100 + KEEP; id++) {
    mk_tensor_t *u = mn_tensor_get(&reg, id);
    assert_non_null(u);
    assert_int_equal(u->id, id);
  }

  /* Growth past the first table size keeps everything. */
  for (uint64_t id = 50000; id < 52000; id++)
    assert_non_null(mn_tensor_new(&reg, id, MK_U8, 0, one, err, sizeof(err)));
  assert_int_equal(reg.ntensors, 1 + KEEP + 2000);
  for (uint64_t id = 50000; id < 52000; id++) assert_int_equal(mn_tensor_get(&reg, id)->id, id);
  for (uint64_t id = 100; id < 100 + KEEP; id++) assert_non_null(mn_tensor_get(&reg, id));
  for (uint64_t id = 50000; id < 52000; id += 2) assert_int_equal(mn_tensor_free(&reg, id), 0);
  assert_int_equal(reg.ntensors, 1 + KEEP + 1000);
  for (uint64_t id = 50001; id < 52000; id += 2) assert_non_null(mn_tensor_get(&reg, id));

  /* Ids that all hash to the same slot (multiples of 2^32) form one long
   * probe chain: freeing from its middle must not hide what lies beyond. */
  enum { CHAIN = 300 };
  for (uint64_t k = 1; k <= CHAIN; k++)
    assert_non_null(mn_tensor_new(&reg, k << 32, MK_U8, 1, one, err, sizeof(err)));
  for (uint64_t k = 1; k <= CHAIN; k += 3) assert_int_equal(mn_tensor_free(&reg, k << 32), 0);
  for (uint64_t k = 1; k <= CHAIN; k++) {
    mk_tensor_t *u = mn_tensor_get(&reg, k << 32);
    if (k % 3 == 1) {
      assert_null(u);
      assert_int_equal(mn_tensor_free(&reg, k << 32), MN_ENOTFOUND);
    } else {
      assert_non_null(u);
      assert_true(u->id == k << 32);
    }
  }
  /* Re-adding reuses freed slots without duplicating live ids. */
  for (uint64_t k = 1; k <= CHAIN; k++) {
    mk_tensor_t *u = mn_tensor_new(&reg, k << 32, MK_U8, 1, one, err, sizeof(err));
    if (k % 3 == 1) assert_non_null(u);
    else assert_null(u); /* already exists */
  }
  for (uint64_t k = 1; k <= CHAIN; k++) assert_non_null(mn_tensor_get(&reg, k << 32));
  assert_int_equal(reg.ntensors, 1 + KEEP + 1000 + CHAIN);
  mn_registry_close(&reg); /* frees what is still live */
}

static void test_registry_libs(void **state) {
  (void)state;
  mn_registry_t reg;
  char err[512];
  mn_registry_init(&reg, prefix());
  assert_null(mn_registry_find(&reg, "noop", 4));
  err[0] = '\0';
  assert_null(mn_registry_load(&reg, "nope_not_here", err, sizeof(err)));
  assert_non_null(strstr(err, "nope_not_here"));
  const mk_library_t *lib = mn_registry_load(&reg, "basic", err, sizeof(err));
  if (lib == NULL) print_error("%s\n", err);
  assert_non_null(lib);
  assert_int_equal(lib->abi_version, MK_ABI_VERSION);
  assert_ptr_equal(mn_registry_load(&reg, "basic", err, sizeof(err)), lib);
  assert_int_equal(reg.nlibs, 1);
  assert_int_equal(reg.nkernels, (size_t)lib->count);
  for (int i = 0; i < lib->count; i++) {
    const char *name = lib->kernels[i].name;
    assert_ptr_equal(mn_registry_find(&reg, name, strlen(name)), &lib->kernels[i]);
  }
  /* Lookups use the given length, not a NUL. */
  assert_non_null(mn_registry_find(&reg, "noopXYZ", 4));
  assert_null(mn_registry_find(&reg, "noo", 3));
  assert_null(mn_registry_find(&reg, "noopX", 5));
  /* A second library adds to the table. */
  const mk_library_t *faulty = mn_registry_load(&reg, "faulty", err, sizeof(err));
  assert_non_null(faulty);
  assert_int_equal(reg.nlibs, 2);
  assert_int_equal(reg.nkernels, (size_t)(lib->count + faulty->count));
  assert_non_null(mn_registry_find(&reg, "noop", 4));
  assert_non_null(mn_registry_find(&reg, "fail", 4));
  mn_registry_close(&reg);
}

/* ---- signatures (sig.c), shared by CALLs and actors' proc.call ------------------- */

static void check_sig(const char *text, int min, int max, int rest) {
  mn_sig_t s;
  mn_sig_parse(&s, text);
  if (s.min != min || s.max != max || s.rest != rest)
    print_error("signature \"%s\": got %d..%d rest %d, wanted %d..%d rest %d\n", text, s.min, s.max, s.rest, min,
                max, rest);
  assert_int_equal(s.min, min);
  assert_int_equal(s.max, max);
  assert_int_equal(s.rest, rest);
}

/* The count check's message, for n arguments against `text` ("" when it passes). */
static const char *count_err(const char *text, int n, char *err, size_t errlen) {
  mn_sig_t s;
  mn_sig_parse(&s, text);
  err[0] = '\0';
  if (mn_sig_check_count(&s, n, err, errlen) == 0) assert_string_equal(err, "");
  return err;
}

static void test_sig_parse(void **state) {
  char err[256];
  check_sig("", 0, 0, 0);
  check_sig(NULL, 0, 0, 0);
  check_sig("tn", 2, 2, 0);
  check_sig("tn?", 1, 2, 0);
  check_sig("i?s", 0, 2, 0); /* every letter after the first '?' is optional too */
  check_sig("s*", 1, 1, 1);
  check_sig("*", 0, 0, 1);
  /* Malformed ones keep the lenient reading calls have always had. */
  check_sig("?i", 1, 1, 0);  /* a '?' with no letter before it is ignored */
  check_sig("n*nn", 1, 1, 1); /* letters after '*' are ignored */
  char many[MN_MAX_ARGS + 8];
  memset(many, 'n', sizeof(many) - 1);
  many[sizeof(many) - 1] = '\0';
  check_sig(many, MN_MAX_ARGS, MN_MAX_ARGS, 0);

  mn_sig_t s;
  mn_sig_parse(&s, "tx*");
  assert_int_equal(mn_sig_letter(&s, 0), 't');
  assert_int_equal(mn_sig_letter(&s, 1), 'x');
  assert_int_equal(mn_sig_letter(&s, 5), 'a'); /* what '*' accepts */
  assert_string_equal(mn_sig_want_name('x'), "any value");
  assert_string_equal(mn_sig_want_name('B'), "boolean");

  /* Good counts pass; bad ones say what was expected, got, and the signature. */
  assert_string_equal(count_err("tn", 2, err, sizeof(err)), "");
  assert_string_equal(count_err("tn?", 1, err, sizeof(err)), "");
  assert_string_equal(count_err("s*", 9, err, sizeof(err)), "");
  assert_string_equal(count_err("tn", 3, err, sizeof(err)), "expected 2 arguments, got 3 (signature \"tn\")");
  assert_string_equal(count_err("t", 0, err, sizeof(err)), "expected 1 argument, got 0 (signature \"t\")");
  assert_string_equal(count_err("", 1, err, sizeof(err)), "expected 0 arguments, got 1 (signature \"\")");
  assert_string_equal(count_err("tn?", 3, err, sizeof(err)), "expected 1 to 2 arguments, got 3 (signature \"tn?\")");
  assert_string_equal(count_err("s*", 0, err, sizeof(err)), "expected 1 argument, got 0 (signature \"s*\")");
}

static void test_sig_coerce(void **state) {
  char err[256];
  mk_arg_t a = {.type = MK_ARG_INT, .v.i = 3};
  assert_int_equal(mn_sig_coerce(&a, 'n', 1, "integer", err, sizeof(err)), 0);
  assert_int_equal(a.type, MK_ARG_NUMBER);
  assert_true(a.v.num == 3.0);
  a = (mk_arg_t){.type = MK_ARG_NUMBER, .v.num = 2.0};
  assert_int_equal(mn_sig_coerce(&a, 'i', 1, "number", err, sizeof(err)), 0);
  assert_int_equal(a.type, MK_ARG_INT);
  assert_int_equal(a.v.i, 2);
  a = (mk_arg_t){.type = MK_ARG_STRING, .v.str = {"ab", 2}};
  assert_int_equal(mn_sig_coerce(&a, 'b', 1, "string", err, sizeof(err)), 0);
  assert_int_equal(a.type, MK_ARG_BYTES);
  a = (mk_arg_t){.type = MK_ARG_BOOL, .v.b = 1};
  assert_int_equal(mn_sig_coerce(&a, 'a', 1, "boolean", err, sizeof(err)), 0);
  assert_int_equal(mn_sig_coerce(&a, 'x', 1, "boolean", err, sizeof(err)), 0); /* an unknown letter takes anything */

  /* The message names the argument, what its letter wants and what came. */
  a = (mk_arg_t){.type = MK_ARG_NUMBER, .v.num = 2.5};
  assert_int_equal(mn_sig_coerce(&a, 'i', 2, "number", err, sizeof(err)), MN_EINVAL);
  assert_string_equal(err, "argument 2: expected integer, got number");
  a = (mk_arg_t){.type = MK_ARG_NUMBER, .v.num = NAN};
  assert_int_equal(mn_sig_coerce(&a, 'i', 1, "number", err, sizeof(err)), MN_EINVAL);
  a = (mk_arg_t){.type = MK_ARG_NUMBER, .v.num = 1e19}; /* integral, but no int64 holds it */
  assert_int_equal(mn_sig_coerce(&a, 'i', 1, "number", err, sizeof(err)), MN_EINVAL);
  a = (mk_arg_t){.type = MK_ARG_STRING, .v.str = {"x", 1}};
  assert_int_equal(mn_sig_coerce(&a, 't', 1, "string", err, sizeof(err)), MN_EINVAL);
  assert_string_equal(err, "argument 1: expected tensor, got string");
  a = (mk_arg_t){.type = MK_ARG_INT, .v.i = 1};
  assert_int_equal(mn_sig_coerce(&a, 'B', 3, "integer", err, sizeof(err)), MN_EINVAL);
  assert_string_equal(err, "argument 3: expected boolean, got integer");
  assert_int_equal(mn_sig_coerce(&a, 's', 4, "integer", err, sizeof(err)), MN_EINVAL);
  assert_string_equal(err, "argument 4: expected string, got integer");
}

/* ---- scratch (scratch.c), shared by CALLs and actors' proc.call ------------------ */

static void test_scratch(void **state) {
  mn_scratch_t s;
  mn_scratch_init(&s);
  void *first = mn_scratch_get(&s, 100);
  assert_non_null(first);
  assert_int_equal((uintptr_t)first % MN_SCRATCH_ALIGN, 0);
  void *extra[MN_MAX_SCRATCH];
  for (int i = 0; i < MN_MAX_SCRATCH; i++) {
    extra[i] = mn_scratch_get(&s, i == 0 ? 0 : 32); /* even 0 bytes is a block of its own */
    assert_non_null(extra[i]);
    assert_ptr_not_equal(extra[i], first);
    memset(extra[i], 0xab, i == 0 ? 0 : 32);
  }
  assert_null(mn_scratch_get(&s, 8)); /* one block more than MN_MAX_SCRATCH extra */
  mn_scratch_release(&s);
  /* The next call gets the kept block back while it is big enough. */
  assert_ptr_equal(mn_scratch_get(&s, 64), first);
  mn_scratch_release(&s);
  void *bigger = mn_scratch_get(&s, 4096);
  assert_non_null(bigger);
  memset(bigger, 0, 4096);
  mn_scratch_release(&s);
  assert_ptr_equal(mn_scratch_get(&s, 4096), bigger);
  mn_scratch_close(&s);
  assert_null(s.first);
  assert_int_equal(s.nextra, 0);
  mn_scratch_close(&s); /* closing an empty one is harmless */
}

/* ---- the built-in table ------------------------------------------------------------- */

static int b_test_names(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                        size_t errlen) {
  return mk_return_string(ctx, b->name, strlen(b->name)) || mk_return_string(ctx, b->usage, strlen(b->usage)) ||
                 mk_return_string(ctx, ctx->kernel, strlen(ctx->kernel))
             ? -1
             : 0;
}

static int b_test_refuse(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                         size_t errlen) {
  x->err_kind = "refused";
  snprintf(err, errlen, "%s refuses %u arguments", b->name, args->via.array.size);
  return -1;
}

static void test_unknown(const mn_builtin_module_t *m, const char *name, size_t nl, char *err, size_t errlen) {
  char names[128];
  snprintf(err, errlen, "no '%.*s' here (try %s)", (int)nl, name,
           mn_exec_builtin_names(m, sizeof("__test") - 1, names, sizeof(names)));
}

static const mn_builtin_t test_entries[] = {
  {"__test_names", b_test_names, "(nothing)"},
  {"__test_refuse", b_test_refuse, "(anything)"},
};
static const mn_builtin_module_t test_module = {"__test_", test_entries, 2, test_unknown};

/* The message of a failed reply, copied out. */
static const char *reply_message(reply_t *r, char *buf, size_t len) {
  const msgpack_object *m = mn_map_get(&r->obj.via.array.ptr[3], "message");
  assert_non_null(m);
  snprintf(buf, len, "%.*s", (int)m->via.str.size, m->via.str.ptr);
  return buf;
}

static void test_builtin_table(void **state) {
  fix_t *f = *state;
  reply_t r;
  char msg[MN_MAX_ERRMSG];
  assert_int_equal(mn_exec_register(&test_module), 0);

  /* A registered module's entry gets its own row and the called name. */
  uint64_t seq = call0(f, "__test_names", &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 3);
  assert_int_equal(v->via.array.ptr[0].via.str.size, strlen("__test_names"));
  assert_memory_equal(v->via.array.ptr[1].via.str.ptr, "(nothing)", strlen("(nothing)"));
  assert_memory_equal(v->via.array.ptr[2].via.str.ptr, "__test_names", strlen("__test_names"));
  reply_free(&r);
  seq = call_str(f, "__test_refuse", "x", &r);
  expect_fail(&r, seq, "refused", "__test_refuse", "__test_refuse refuses 1 arguments", NULL);
  reply_free(&r);

  /* A name with the module's prefix but no entry (a prefix of one, too) gets the module's message. */
  seq = call0(f, "__test_name", &r);
  expect_fail(&r, seq, "bad_args", "__test_name", NULL, NULL);
  assert_string_equal(reply_message(&r, msg, sizeof(msg)), "no '__test_name' here (try __test_names, _refuse)");
  reply_free(&r);
  /* Without a module's prefix, the executor's own table answers, or says it has no such built-in. */
  seq = call0(f, "__tes", &r);
  expect_fail(&r, seq, "bad_args", "__tes", NULL, NULL);
  assert_string_equal(reply_message(&r, msg, sizeof(msg)), "unknown built-in '__tes'");
  reply_free(&r);
  seq = call0(f, "__lost", &r);
  expect_fail(&r, seq, "lost", "__lost", "payload was lost in a reconnect", NULL);
  reply_free(&r);
  seq = call0(f, "__info", &r);
  assert_int_equal(expect_ok(&r, seq)->via.array.size, 6);
  reply_free(&r);

  /* The table of modules is bounded; the modules already there keep working. */
  int n = 1;
  while (mn_exec_register(&test_module) == 0) n++;
  assert_true(n <= MN_MAX_BUILTIN_MODULES);
  assert_int_equal(mn_exec_register(&test_module), MN_ELIMIT);
  seq = call0(f, "__test_names", &r);
  expect_ok(&r, seq);
  reply_free(&r);
}

int main(void) {
  /* The basic library links OpenBLAS; keep it from starting a thread pool. */
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_load, setup, teardown),
    cmocka_unit_test_setup_teardown(test_noop_echo, setup, teardown),
    cmocka_unit_test_setup_teardown(test_bad_args, setup, teardown),
    cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
    cmocka_unit_test_setup_teardown(test_faulty_fail, setup, teardown),
    cmocka_unit_test_setup_teardown(test_tensors, setup, teardown),
    cmocka_unit_test_setup_teardown(test_tensor_new_errors, setup, teardown),
    cmocka_unit_test_setup_teardown(test_tensor_builtins_without_id, setup, teardown),
    cmocka_unit_test_setup_teardown(test_sequence, setup, teardown),
    cmocka_unit_test_setup_teardown(test_protocol_errors, setup, teardown),
    cmocka_unit_test(test_registry_tensors),
    cmocka_unit_test(test_registry_libs),
    cmocka_unit_test(test_sig_parse),
    cmocka_unit_test(test_sig_coerce),
    cmocka_unit_test(test_scratch),
    /* Last: it fills the process's table of built-in modules. */
    cmocka_unit_test_setup_teardown(test_builtin_table, setup, teardown),
  };
  return cmocka_run_group_tests_name("exec", tests, NULL, NULL);
}
