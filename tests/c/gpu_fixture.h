/*
 * gpu_fixture.h - what test_gpu.c and test_gpu_tensors.c share: the fake
 * CUDA runtime and NCCL as gpu.c's tables, an executor per test (setup_real:
 * the real loader; setup_fake: the fake), and calls run through
 * mn_exec_frame() exactly as a proc runs them, with their replies decoded.
 */
#ifndef MN_TEST_GPU_FIXTURE_H
#define MN_TEST_GPU_FIXTURE_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "clock.h"
#include "exec.h"
#include "fake_gpu.h"
#include "registry.h"
#include "wire.h"

#include "clock.h"
#include "exec.h"
#include "registry.h"
#include "wire.h"

#define BOGUS_CUDART "libmonarch-no-such-cudart.so"
#define BOGUS_NCCL "libmonarch-no-such-nccl.so"

static const mn_cudart_t fake_rt = {f_count, f_set, f_malloc, f_free, f_memset, f_memcpy, f_sync, f_query,
                                    f_meminfo, f_props, f_attr, f_version, f_version, f_estr, f_last};

static const mn_nccl_t fake_nccl = {n_version, n_id, n_init, n_destroy, n_abort, n_async, n_all_reduce,
                                    n_broadcast, n_all_gather, n_reduce_scatter, n_estr, n_last};

/* ---- fixture and calls -------------------------------------------------------- */

typedef struct {
  mn_exec_t x;
  atomic_int cancel;
  uint64_t seq;
} fix_t;

static inline int setup_with(void **state, const mn_cudart_t *rt, const mn_nccl_t *nccl) {
  fix_t *f = calloc(1, sizeof(*f));
  if (f == NULL) return -1;
  atomic_init(&f->cancel, 0);
  if (mn_exec_init(&f->x, "build", 0, 1, &f->cancel) != 0) return -1;
  memset(&F, 0, sizeof(F));
  F.devices = 2;
  unsetenv("MONARCH_CUDART");
  unsetenv("MONARCH_NCCL");
  unsetenv("MONARCH_GPU_TIMEOUT");
  mn__gpu_reset(rt, nccl);
  *state = f;
  return 0;
}
static inline int setup_real(void **state) { return setup_with(state, NULL, NULL); }
static inline int setup_fake(void **state) { return setup_with(state, &fake_rt, &fake_nccl); }
static inline int setup_fake_runtime(void **state) { return setup_with(state, &fake_rt, NULL); }

static inline int teardown(void **state) {
  fix_t *f = *state;
  mn_exec_close(&f->x);
  mn__gpu_reset(NULL, NULL);
  free(f);
  return 0;
}

typedef struct {
  mn_buf_t b;
  msgpack_packer pk;
  size_t start;
  uint64_t seq;
} call_t;

static inline msgpack_packer *begin(fix_t *f, call_t *c, const char *name, uint32_t nargs) {
  mn_buf_init(&c->b);
  msgpack_packer_init(&c->pk, &c->b, mn_buf_write_cb);
  c->start = mn_frame_begin(&c->b);
  c->seq = ++f->seq;
  msgpack_pack_array(&c->pk, 4);
  msgpack_pack_int(&c->pk, MN_MSG_CALL);
  msgpack_pack_uint64(&c->pk, c->seq);
  mn_pack_cstr(&c->pk, name);
  msgpack_pack_array(&c->pk, nargs);
  return &c->pk;
}

static inline void pack_tensor(msgpack_packer *pk, uint64_t id) {
  char be[8];
  for (int i = 0; i < 8; i++) be[i] = (char)(id >> (56 - 8 * i));
  msgpack_pack_ext(pk, 8, 1);
  msgpack_pack_ext_body(pk, be, 8);
}

typedef struct {
  char *body;
  msgpack_zone zone;
  msgpack_object obj;
  int ok;
  char kind[64];
  char msg[MN_MAX_ERRMSG + 1];
  const msgpack_object *values;
} reply_t;

/* Runs the call and decodes its one RESULT frame. */
static inline void run(fix_t *f, call_t *c, reply_t *r) {
  const char *body;
  char err[256];
  mn_frame_end(&c->b, c->start);
  int64_t n = mn_frame_peek(c->b.data, c->b.len, MN_MAX_FRAME, &body);
  assert_true(n > 0);
  assert_int_equal(mn_exec_frame(&f->x, body, (size_t)n), 0);
  mn_buf_free(&c->b);
  n = mn_frame_peek(f->x.out.data, f->x.out.len, MN_MAX_FRAME, &body);
  assert_true(n > 0);
  r->body = malloc((size_t)n);
  assert_non_null(r->body);
  memcpy(r->body, body, (size_t)n);
  mn_buf_consume(&f->x.out, f->x.out.len);
  assert_true(msgpack_zone_init(&r->zone, 4096));
  assert_int_equal(mn_decode(r->body, (size_t)n, &r->zone, &r->obj, err, sizeof(err)), 0);
  assert_int_equal(mn_msg_type(&r->obj), MN_MSG_RESULT);
  r->ok = r->obj.via.array.ptr[2].via.boolean;
  r->kind[0] = r->msg[0] = '\0';
  r->values = NULL;
  if (r->ok) {
    r->values = &r->obj.via.array.ptr[3];
  } else {
    const msgpack_object *k = mn_map_get(&r->obj.via.array.ptr[3], "kind");
    const msgpack_object *m = mn_map_get(&r->obj.via.array.ptr[3], "message");
    assert_non_null(k);
    assert_non_null(m);
    snprintf(r->kind, sizeof(r->kind), "%.*s", (int)k->via.str.size, k->via.str.ptr);
    snprintf(r->msg, sizeof(r->msg), "%.*s", (int)m->via.str.size, m->via.str.ptr);
  }
}

static inline void done(reply_t *r) {
  msgpack_zone_destroy(&r->zone);
  free(r->body);
}

static inline void expect_ok(reply_t *r) {
  if (!r->ok) print_error("call failed: %s: %s\n", r->kind, r->msg);
  assert_true(r->ok);
}

static inline void expect_fail(reply_t *r, const char *kind, const char *needle) {
  if (r->ok || strcmp(r->kind, kind) != 0 || strstr(r->msg, needle) == NULL)
    print_error("wanted a %s error with \"%s\"; got ok=%d kind \"%s\" message \"%s\"\n", kind, needle, r->ok,
                r->kind, r->msg);
  assert_false(r->ok);
  assert_string_equal(r->kind, kind);
  assert_non_null(strstr(r->msg, needle));
}

/* Shorthands: each runs one call and leaves its reply in r. */
static inline void call0(fix_t *f, const char *name, reply_t *r) {
  call_t c;
  begin(f, &c, name, 0);
  run(f, &c, r);
}

static inline void call_t1(fix_t *f, const char *name, uint64_t t, reply_t *r) {
  call_t c;
  pack_tensor(begin(f, &c, name, 1), t);
  run(f, &c, r);
}

static inline void tensor_new(fix_t *f, uint64_t id, const char *dtype, int64_t n, reply_t *r) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, "__gpu_tensor_new", 3);
  msgpack_pack_uint64(pk, id);
  mn_pack_cstr(pk, dtype);
  msgpack_pack_array(pk, 1);
  msgpack_pack_int64(pk, n);
  run(f, &c, r);
}


#endif
