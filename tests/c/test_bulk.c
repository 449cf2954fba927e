/*
 * test_bulk.c - unit tests for host/proc/bulk.c: the peer proof and the
 * striped copies, with this process as its own "controller".
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bulk.h"
#include "err.h"

static uint64_t cookie = 0x5eedf00dULL;

static mn_bulk_peer_t self_peer(void) { return (mn_bulk_peer_t){getpid(), (uint64_t)(uintptr_t)&cookie, cookie}; }

static void proves_itself_and_refuses_a_wrong_cookie(void **state) {
  char err[256];
  mn_bulk_peer_t p = self_peer();
  assert_int_equal(mn_bulk_check_peer(&p, err, sizeof(err)), 0);
  p.cookie++;
  assert_int_equal(mn_bulk_check_peer(&p, err, sizeof(err)), MN_EPEER);
  assert_non_null(strstr(err, "not the controller that asked"));
  p = self_peer();
  setenv("MONARCH_BULK_LOCAL_SIMULATE", "eperm", 1);
  assert_int_equal(mn_bulk_check_peer(&p, err, sizeof(err)), -EPERM);
  assert_non_null(strstr(err, "simulated"));
  unsetenv("MONARCH_BULK_LOCAL_SIMULATE");
}

static void copies_both_ways_striped(void **state) {
  char err[256];
  size_t n = 3 * MN_BULK_STRIPE_MIN + 12345;
  char *a = malloc(n), *b = calloc(1, n);
  assert_non_null(a);
  assert_non_null(b);
  for (size_t i = 0; i < n; i++) a[i] = (char)(i * 31 + 7);
  mn_bulk_peer_t p = self_peer();
  setenv("MONARCH_BULK_THREADS", "3", 1);
  assert_int_equal(mn_bulk_threads(n), 3);
  assert_int_equal(mn_bulk_copy(&p, 0, b, (uint64_t)(uintptr_t)a, n, NULL, err, sizeof(err)), 0);
  assert_memory_equal(a, b, n);
  memset(a, 0, n);
  assert_int_equal(mn_bulk_copy(&p, 1, b, (uint64_t)(uintptr_t)a, n, NULL, err, sizeof(err)), 0);
  assert_memory_equal(a, b, n);
  unsetenv("MONARCH_BULK_THREADS");
  free(a);
  free(b);
}

static void counts_threads_within_limits(void **state) {
  setenv("MONARCH_BULK_THREADS", "1000", 1);
  assert_int_equal(mn_bulk_threads((size_t)MN_BULK_STRIPE_MIN * 100), MN_BULK_MAX_THREADS);
  assert_int_equal(mn_bulk_threads(10), 1); /* one stripe: small copies stay on the caller's thread */
  setenv("MONARCH_BULK_THREADS", "0", 1);
  assert_int_equal(mn_bulk_threads((size_t)MN_BULK_STRIPE_MIN * 100), 1);
  unsetenv("MONARCH_BULK_THREADS");
}

static void stops_when_cancelled_and_names_a_bad_address(void **state) {
  char err[256], buf[64];
  mn_bulk_peer_t p = self_peer();
  atomic_int cancel;
  atomic_init(&cancel, 1);
  assert_int_equal(mn_bulk_copy(&p, 0, buf, (uint64_t)(uintptr_t)buf, sizeof(buf), &cancel, err, sizeof(err)),
                   MN_ECANCELED);
  assert_non_null(strstr(err, "cancelled"));
  atomic_store(&cancel, 0);
  assert_int_equal(mn_bulk_copy(&p, 0, buf, 16, sizeof(buf), &cancel, err, sizeof(err)), -EFAULT);
  assert_non_null(strstr(err, "reading the controller's memory at 0x10"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(proves_itself_and_refuses_a_wrong_cookie),
      cmocka_unit_test(copies_both_ways_striped),
      cmocka_unit_test(counts_threads_within_limits),
      cmocka_unit_test(stops_when_cancelled_and_names_a_bad_address),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
