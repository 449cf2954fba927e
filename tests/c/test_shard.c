/*
 * test_shard.c - unit tests for the "shard" kernel library (kernels/cpu/shard.c), which the training library
 * uses for the procs' own snapshots and checkpoint shards: a written shard reads back bit for bit and is a
 * checkpoint file (header, CRC-32, payload); a flipped byte, a short file and a wrong size are refused with
 * the file named; a snapshot copies and tags; the CRC-32 is zlib's.
 */
#include "kernel_host.h"

#include <unistd.h>
#include <zlib.h>

static void *shard_handle;
static const mk_library_t *shard;
static char dir[] = "/tmp/test_shard.XXXXXX";

static int setup(void **state) {
  (void)state;
  shard = load("shard.so", &shard_handle);
  rec_reset();
  return shard && mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[64];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
  if (system(cmd) != 0) return -1;
  if (shard_handle) dlclose(shard_handle);
  return 0;
}

static void path_of(char *out, size_t n, const char *name) { snprintf(out, n, "%s/%s", dir, name); }

static void test_write_read(void **state) {
  (void)state;
  float a[4] = { 1, 2, 3, 4 };
  int64_t b[2] = { -5, 6 };
  mk_tensor_t ta = tensor(MK_F32, a, 1, 4), tb = tensor(MK_I64, b, 1, 2);
  char tmp[256], path[256];
  path_of(tmp, sizeof(tmp), "s.tmp");
  path_of(path, sizeof(path), "s.bin");
  static const char head[] = "HEAD";
  assert_int_equal(CALL(shard, "shard_write", A_STR(tmp, strlen(tmp)), A_STR(path, strlen(path)), A_BYTES(head, 4),
                        A_T(&ta), A_T(&tb)),
                   0);
  assert_int_equal(rec.nres, 1);
  uLong crc = crc32(0L, Z_NULL, 0);
  crc = crc32(crc, (const Bytef *)head, 4);
  crc = crc32(crc, (const Bytef *)a, sizeof(a));
  crc = crc32(crc, (const Bytef *)b, sizeof(b));
  assert_int_equal(rec.res[0].i, (int64_t)crc);
  assert_int_equal(access(tmp, F_OK), -1); /* renamed into place */
  float a2[4] = { 0 };
  int64_t b2[2] = { 0 };
  mk_tensor_t ra = tensor(MK_F32, a2, 1, 4), rb = tensor(MK_I64, b2, 1, 2);
  assert_int_equal(CALL(shard, "shard_read", A_STR(path, strlen(path)), A_INT(4), A_T(&ra), A_T(&rb)), 0);
  assert_memory_equal(a, a2, sizeof(a));
  assert_memory_equal(b, b2, sizeof(b));
  /* The CRC-32 of the tensors alone, as the end-of-run check computes it on each proc. */
  assert_int_equal(CALL(shard, "shard_crc", A_T(&ta)), 0);
  assert_int_equal(rec.res[0].i, (int64_t)crc32(crc32(0L, Z_NULL, 0), (const Bytef *)a, sizeof(a)));
}

static void test_corrupt_refused(void **state) {
  (void)state;
  float a[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
  mk_tensor_t ta = tensor(MK_F32, a, 1, 8);
  char tmp[256], path[256];
  path_of(tmp, sizeof(tmp), "c.tmp");
  path_of(path, sizeof(path), "c.bin");
  assert_int_equal(CALL(shard, "shard_write", A_STR(tmp, strlen(tmp)), A_STR(path, strlen(path)), A_BYTES("H", 1),
                        A_T(&ta)),
                   0);
  FILE *f = fopen(path, "r+b");
  assert_non_null(f);
  fseek(f, 10, SEEK_SET); /* a byte of the payload */
  fputc('x', f);
  fclose(f);
  assert_int_equal(CALL(shard, "shard_read", A_STR(path, strlen(path)), A_INT(1), A_T(&ta)), -1);
  assert_non_null(strstr(rec.err, "checksum mismatch (stored "));
  assert_non_null(strstr(rec.err, path));
  /* A tensor of another size than the file holds. */
  mk_tensor_t small = tensor(MK_F32, a, 1, 4);
  assert_int_equal(CALL(shard, "shard_read", A_STR(path, strlen(path)), A_INT(1), A_T(&small)), -1);
  assert_non_null(strstr(rec.err, "truncated or padded"));
  assert_int_equal(truncate(path, 20), 0);
  assert_int_equal(CALL(shard, "shard_read", A_STR(path, strlen(path)), A_INT(1), A_T(&ta)), -1);
  assert_non_null(strstr(rec.err, "bytes but its tensors need"));
  char none[256];
  path_of(none, sizeof(none), "none.bin");
  assert_int_equal(CALL(shard, "shard_read", A_STR(none, strlen(none)), A_INT(1), A_T(&ta)), -1);
  assert_non_null(strstr(rec.err, "cannot open"));
}

static void test_snap(void **state) {
  (void)state;
  double live[3] = { 1, 2, 3 }, copy[3] = { 0 };
  int64_t tag[1] = { 7 };
  mk_tensor_t tl = tensor(MK_F64, live, 1, 3), tc = tensor(MK_F64, copy, 1, 3), tt = tensor(MK_I64, tag, 1, 1);
  assert_int_equal(CALL(shard, "shard_snap", A_T(&tt), A_NUM(42), A_T(&tl), A_T(&tc)), 0);
  assert_memory_equal(live, copy, sizeof(live));
  assert_int_equal(tag[0], 42);
  /* An odd number of tensors after the step, or a pair of two sizes, is refused and tags nothing. */
  assert_int_equal(CALL(shard, "shard_snap", A_T(&tt), A_NUM(43), A_T(&tl)), -1);
  assert_non_null(strstr(rec.err, "pairs"));
  mk_tensor_t short_ = tensor(MK_F64, copy, 1, 2);
  assert_int_equal(CALL(shard, "shard_snap", A_T(&tt), A_NUM(43), A_T(&tl), A_T(&short_)), -1);
  assert_int_equal(tag[0], 42);
  mk_tensor_t badtag = tensor(MK_F64, copy, 1, 1);
  assert_int_equal(CALL(shard, "shard_snap", A_T(&badtag), A_NUM(1), A_T(&tl), A_T(&tc)), -1);
  assert_non_null(strstr(rec.err, "i64"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_write_read),
    cmocka_unit_test(test_corrupt_refused),
    cmocka_unit_test(test_snap),
  };
  return cmocka_run_group_tests_name("shard", tests, setup, teardown);
}
