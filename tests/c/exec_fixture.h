/*
 * exec_fixture.h - what the executor's tests share (test_exec.c,
 * test_exec_tensors.c): an mn_exec_t per test, CALL frames packed here and
 * handed to mn_exec_frame() exactly as the proc's I/O thread would (the
 * body, without the 4-byte length prefix), and the RESULT / ERROR frames it
 * leaves in x->out decoded and checked. Kernel libraries load from
 * $MONARCH_PREFIX/lib/monarch, default build/lib/monarch (tests run from the
 * repository root).
 */
#ifndef MN_TEST_EXEC_FIXTURE_H
#define MN_TEST_EXEC_FIXTURE_H

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

static inline const char *prefix(void) {
  const char *p = getenv("MONARCH_PREFIX");
  return p && *p ? p : "build";
}

static inline int setup(void **state) {
  fix_t *f = calloc(1, sizeof(*f));
  if (f == NULL) return -1;
  atomic_init(&f->cancel, 0);
  if (mn_exec_init(&f->x, prefix(), 3, 8, &f->cancel) != 0) return -1;
  *state = f;
  return 0;
}

static inline int teardown(void **state) {
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
static inline msgpack_packer *call_begin(call_t *c, uint64_t seq, const char *name, uint32_t nargs) {
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
static inline int call_run(mn_exec_t *x, call_t *c) {
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

static inline void pack_tensor(msgpack_packer *pk, uint64_t id) {
  char be[8];
  for (int i = 0; i < 8; i++) be[i] = (char)(id >> (56 - 8 * i));
  msgpack_pack_ext(pk, 8, 1);
  msgpack_pack_ext_body(pk, be, 8);
}

static inline void pack_bin(msgpack_packer *pk, const void *p, size_t n) {
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
static inline void take_reply(mn_exec_t *x, reply_t *r) {
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

static inline void reply_free(reply_t *r) {
  msgpack_zone_destroy(&r->zone);
  free(r->body);
}

/* Checks r is [RESULT, seq, true, [values]]; returns the values array. */
static inline const msgpack_object *expect_ok(reply_t *r, uint64_t seq) {
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
static inline void expect_fail(reply_t *r, uint64_t seq, const char *kind, const char *kernel,
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
static inline void expect_error_frame(mn_exec_t *x, int code, const char *needle) {
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
static inline uint64_t call0(fix_t *f, const char *name, reply_t *r) {
  call_t c;
  uint64_t seq = ++f->seq;
  call_begin(&c, seq, name, 0);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, r);
  return seq;
}

static inline uint64_t call_str(fix_t *f, const char *name, const char *arg, reply_t *r) {
  call_t c;
  uint64_t seq = ++f->seq;
  mn_pack_cstr(call_begin(&c, seq, name, 1), arg);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, r);
  return seq;
}

static inline uint64_t call_t1(fix_t *f, const char *name, uint64_t tid, reply_t *r) {
  call_t c;
  uint64_t seq = ++f->seq;
  pack_tensor(call_begin(&c, seq, name, 1), tid);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, r);
  return seq;
}

static inline uint64_t call_id(fix_t *f, const char *name, uint64_t id, reply_t *r) {
  call_t c;
  uint64_t seq = ++f->seq;
  msgpack_pack_uint64(call_begin(&c, seq, name, 1), id);
  assert_int_equal(call_run(&f->x, &c), 0);
  take_reply(&f->x, r);
  return seq;
}

static inline void load_ok(fix_t *f, const char *lib) {
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
static inline uint64_t tensor_new(fix_t *f, uint64_t id, const char *dtype, int ndim, const int64_t *shape,
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

static inline void tensor_new_ok(fix_t *f, uint64_t id, const char *dtype, int ndim, const int64_t *shape) {
  reply_t r;
  uint64_t seq = tensor_new(f, id, dtype, ndim, shape, &r);
  const msgpack_object *v = expect_ok(&r, seq);
  assert_int_equal(v->via.array.size, 0);
  reply_free(&r);
}

static inline double as_number(const msgpack_object *o) {
  if (o->type == MSGPACK_OBJECT_FLOAT64 || o->type == MSGPACK_OBJECT_FLOAT32) return o->via.f64;
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return (double)o->via.u64;
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) return (double)o->via.i64;
  fail_msg("not a number: type %d", (int)o->type);
  return 0;
}


#endif
