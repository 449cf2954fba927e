/*
 * test_trace.c - unit tests for host/proc/trace.c (the proc's ring of spans)
 * and the __trace built-in, driven through mn_exec_frame as the proc's
 * executor drives it. The "basic" kernel library comes from
 * $MONARCH_PREFIX/lib/monarch (default build/lib/monarch).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "trace.h"
#include "wire.h"

/* ---- the ring ------------------------------------------------------------------ */

static void push_named(mn_trace_t *t, const char *name, int64_t t0) {
  mn_trace_span_t *s = mn_trace_push(t, MN_TRACE_CALL, name, strlen(name), t0);
  s->seq = (uint64_t)t0;
}

static uint64_t le(const unsigned char *p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* A full ring drops its oldest spans, counts them, and hands out the rest oldest first. */
static void test_ring_wraps_and_counts_drops(void **state) {
  mn_trace_t t;
  char err[200];
  mn_trace_init(&t, 0);
  assert_int_equal(mn_trace_start(&t, 4, err, sizeof(err)), 0);
  char name[8];
  for (int i = 1; i <= 6; i++) {
    snprintf(name, sizeof(name), "k%d", i);
    push_named(&t, name, i);
  }
  assert_int_equal(t.count, 4);
  assert_int_equal(t.dropped, 2);
  unsigned char out[4 * MN_TRACE_REC];
  assert_int_equal(mn_trace_take(&t, out, 3), 3);
  for (int i = 0; i < 3; i++) {
    const unsigned char *r = out + i * MN_TRACE_REC;
    assert_int_equal(le(r, 8), i + 3);       /* t0: spans 3, 4, 5 */
    assert_int_equal(le(r + 16, 8), i + 3);  /* seq */
    assert_int_equal(r[42], 2);              /* name_len */
    assert_int_equal(r[45], '3' + i);
  }
  assert_int_equal(mn_trace_take(&t, out, 3), 1);
  assert_int_equal(le(out, 8), 6);
  assert_int_equal(mn_trace_take(&t, out, 3), 0);
  mn_trace_close(&t);
}

/* A name longer than the record keeps its first MN_TRACE_NAME bytes; a ring over the limit is refused. */
static void test_long_names_are_cut_and_limits_hold(void **state) {
  mn_trace_t t;
  char err[200] = "";
  mn_trace_init(&t, 0);
  assert_int_equal(mn_trace_start(&t, MN_TRACE_SPANS_MAX + 1, err, sizeof(err)), MN_EINVAL);
  assert_non_null(strstr(err, "MN_TRACE_SPANS_MAX"));
  assert_int_equal(mn_trace_start(&t, 2, err, sizeof(err)), 0);
  char longname[100];
  memset(longname, 'a', sizeof(longname));
  mn_trace_push(&t, MN_TRACE_CALL, longname, sizeof(longname), 0);
  unsigned char out[MN_TRACE_REC];
  assert_int_equal(mn_trace_take(&t, out, 1), 1);
  assert_int_equal(out[42], MN_TRACE_NAME);
  mn_trace_label(&t, MN_TRACE_ENDPOINT, longname, sizeof(longname), "e", 1);
  assert_int_equal(t.label_len, MN_TRACE_NAME - 1);
  mn_trace_close(&t);
}

/* ---- __trace through the executor ------------------------------------------------- */

typedef struct {
  mn_exec_t x;
  atomic_int cancel;
  uint64_t seq;
} fix_t;

static int setup(void **state) {
  fix_t *f = calloc(1, sizeof(*f));
  const char *p = getenv("MONARCH_PREFIX");
  if (f == NULL || mn_exec_init(&f->x, p && *p ? p : "build", 0, 1, &f->cancel) != 0) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fix_t *f = *state;
  mn_exec_close(&f->x);
  free(f);
  return 0;
}

/* Runs name(str_arg?, int_arg?) and returns the reply's decoded value array in *v (zone-owned). */
static int run(fix_t *f, const char *name, const char *sarg, int64_t iarg, msgpack_zone *z, msgpack_object *v) {
  mn_buf_t b;
  msgpack_packer pk;
  mn_buf_init(&b);
  msgpack_packer_init(&pk, &b, mn_buf_write_cb);
  size_t start = mn_frame_begin(&b);
  msgpack_pack_array(&pk, 4);
  msgpack_pack_int(&pk, MN_MSG_CALL);
  msgpack_pack_uint64(&pk, ++f->seq);
  mn_pack_cstr(&pk, name);
  msgpack_pack_array(&pk, (sarg ? 1 : 0) + (iarg >= 0 ? 1 : 0));
  if (sarg) mn_pack_cstr(&pk, sarg);
  if (iarg >= 0) msgpack_pack_int64(&pk, iarg);
  mn_frame_end(&b, start);
  assert_int_equal(mn_exec_frame(&f->x, b.data + MN_FRAME_HEADER, b.len - MN_FRAME_HEADER), 0);
  mn_buf_free(&b);
  char err[200];
  mn_buf_t *out = &f->x.out;
  assert_int_equal(mn_decode(out->data + MN_FRAME_HEADER, out->len - MN_FRAME_HEADER, z, v, err, sizeof(err)), 0);
  out->len = 0;
  int ok = v->via.array.ptr[2].via.boolean;
  *v = v->via.array.ptr[3];
  return ok;
}

/* Calls run between start and take are spans in order, with their seq, bytes and failure; __trace itself is not. */
static void test_trace_records_calls(void **state) {
  fix_t *f = *state;
  msgpack_zone z;
  msgpack_object v;
  assert_true(msgpack_zone_init(&z, 4096));
  assert_true(run(f, "__load", "basic", -1, &z, &v));
  assert_true(run(f, "noop", NULL, -1, &z, &v)); /* before start: not recorded */
  assert_true(run(f, "__trace", "start", 16, &z, &v));
  int64_t t_start = v.via.array.ptr[0].via.i64;
  assert_true(run(f, "noop", NULL, -1, &z, &v));
  assert_false(run(f, "no_such_kernel", NULL, -1, &z, &v));
  assert_true(run(f, "__trace", "clock", -1, &z, &v));
  assert_true(run(f, "__trace", "take", -1, &z, &v));
  assert_int_equal(v.via.array.size, 4);
  const msgpack_object *bin = &v.via.array.ptr[1];
  assert_int_equal(bin->type, MSGPACK_OBJECT_BIN);
  assert_int_equal(bin->via.bin.size, 2 * MN_TRACE_REC);
  assert_int_equal(v.via.array.ptr[2].via.u64, 0); /* none left */
  const unsigned char *r = (const unsigned char *)bin->via.bin.ptr;
  assert_int_equal(le(r + 16, 8), 4);                 /* seq of noop */
  assert_memory_equal(r + 44, "noop", 4);
  assert_int_equal(r[41], 0);                         /* not failed */
  assert_true((int64_t)le(r, 8) >= t_start);
  assert_true(le(r + 8, 8) >= le(r, 8));              /* ends after it starts */
  assert_true(le(r + 32, 4) > 0 && le(r + 36, 4) > 0); /* bytes in and out */
  r += MN_TRACE_REC;
  assert_memory_equal(r + 44, "no_such_kernel", 14);
  assert_int_equal(r[41], 1);                         /* failed */
  assert_true(le(r, 8) >= le(r - MN_TRACE_REC + 8, 8)); /* after the first */
  assert_true(run(f, "__trace", "stop", -1, &z, &v));
  assert_true(run(f, "noop", NULL, -1, &z, &v));
  assert_true(run(f, "__trace", "take", -1, &z, &v));
  assert_int_equal(v.via.array.ptr[1].via.bin.size, 0);
  assert_false(run(f, "__trace", "bogus", -1, &z, &v));
  msgpack_zone_destroy(&z);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_ring_wraps_and_counts_drops),
    cmocka_unit_test(test_long_names_are_cut_and_limits_hold),
    cmocka_unit_test_setup_teardown(test_trace_records_calls, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
