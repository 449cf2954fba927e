/*
 * test_faulty.c - unit tests for the test-only "faulty" kernel library (the
 * kernels that misbehave on purpose, and the counters and marks specs use),
 * loaded and called through the recording host of kernel_host.h.
 */
#include "kernel_host.h"

static void test_faulty_table(void **state) {
  (void)state;
  static const char *const expect[] = {
    "segv", "", "abort", "", "exit", "i", "fail", "s", "spin", "n",
    "hang", "", "print", "s", "eprint", "s", "bump", "", "bumps", "", "mark", "s", NULL,
  };
  check_table(faulty, "faulty", expect);
}

static void test_faulty_fail(void **state) {
  (void)state;
  static const char msg[] = "boom: disk on fire (50%)";
  assert_int_equal(CALL(faulty, "fail", A_STR(msg, strlen(msg))), -1);
  assert_string_equal(rec.err, msg);
  /* Only len bytes count: the string need not be NUL-terminated. */
  assert_int_equal(CALL(faulty, "fail", A_STR("abcdef", 3)), -1);
  assert_string_equal(rec.err, "abc");
}

static void test_faulty_spin(void **state) {
  (void)state;
  rec.cancel_after = 1; /* spin ignores it */
  double t0 = mn_now_s();
  assert_int_equal(CALL(faulty, "spin", A_NUM(0.02)), 0);
  assert_true(mn_now_s() - t0 >= 0.02);
  assert_int_equal(rec.polls, 0);
  assert_int_equal(rec.nres, 1);
  assert_int_equal(rec.res[0].type, MK_ARG_INT);
  assert_true(rec.res[0].i > 0);
  rec.cancel_after = 0;
  assert_int_equal(CALL(faulty, "spin", A_NUM(-1)), -1);
  assert_string_equal(rec.err, "spin: seconds must be in [0, 86400], got -1");
}

/* Runs faulty.<name>("hi there") with fd redirected to a temp file; returns what was written. */
static void captured_print(const char *name, FILE *stream, int fd, char *out, size_t outsz) {
  char path[] = "/tmp/test_kernels.XXXXXX";
  int tmp = mkstemp(path);
  assert_true(tmp >= 0);
  unlink(path);
  fflush(stream);
  int saved = dup(fd);
  assert_true(saved >= 0);
  assert_true(dup2(tmp, fd) == fd);
  int rc = CALL(faulty, name, A_STR("hi there!", 8));
  fflush(stream);
  assert_true(dup2(saved, fd) == fd);
  close(saved);
  assert_int_equal(rc, 0);
  assert_int_equal(rec.nres, 0);
  ssize_t n = pread(tmp, out, outsz - 1, 0);
  close(tmp);
  assert_true(n >= 0);
  out[n] = '\0';
}

static void test_faulty_print(void **state) {
  (void)state;
  char buf[64];
  captured_print("print", stdout, STDOUT_FILENO, buf, sizeof(buf));
  assert_string_equal(buf, "hi there\n");
  captured_print("eprint", stderr, STDERR_FILENO, buf, sizeof(buf));
  assert_string_equal(buf, "hi there\n");
}

static void test_faulty_mark(void **state) {
  (void)state;
  char path[] = "/tmp/test_faulty_mark.XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  assert_int_equal(CALL(faulty, "mark", A_STR(path, strlen(path))), 0);
  assert_int_equal(CALL(faulty, "mark", A_STR(path, strlen(path))), 0);
  assert_int_equal(rec.nres, 0);
  char want[64], got[64] = {0};
  snprintf(want, sizeof(want), "%d\n%d\n", (int)getpid(), (int)getpid());
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  size_t n = fread(got, 1, sizeof(got) - 1, f);
  fclose(f);
  unlink(path);
  assert_int_equal(n, strlen(want));
  assert_string_equal(got, want); /* one line per call, appended */
  assert_int_equal(CALL(faulty, "mark", A_STR("/nonexistent/dir/mark", 21)), -1);
  assert_string_equal(rec.err, "mark: cannot open /nonexistent/dir/mark");
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_faulty_table),
    cmocka_unit_test(test_faulty_fail),
    cmocka_unit_test(test_faulty_spin),
    cmocka_unit_test(test_faulty_print),
    cmocka_unit_test(test_faulty_mark),
  };
  return cmocka_run_group_tests_name("faulty", tests, group_setup, group_teardown);
}
