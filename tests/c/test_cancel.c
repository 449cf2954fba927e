/* test_cancel.c - the table of cancelled calls (host/proc/cancel.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "cancel.h"
#include "err.h"

static void queued_call_is_cancelled_before_it_runs(void **state) {
  atomic_int flag = 0;
  mn_cancel_t c;
  assert_int_equal(mn_cancel_init(&c, &flag), 0);
  assert_int_equal(mn_cancel_request(&c, 7, 3), 0);
  assert_int_equal(mn_cancel_begin(&c, 7, 1), 0); /* other calls run */
  assert_int_equal(mn_cancel_end(&c), 0);
  assert_int_equal(mn_cancel_begin(&c, 7, 3), 1);
  assert_int_equal(mn_cancel_end(&c), 0);
  assert_int_equal(mn_cancel_begin(&c, 7, 4), 0); /* forgotten once passed */
  assert_int_equal(mn_cancel_end(&c), 0);
  assert_int_equal(flag, 0);
  mn_cancel_close(&c);
}

static void running_call_gets_its_flag_and_only_it(void **state) {
  atomic_int flag = 0;
  mn_cancel_t c;
  assert_int_equal(mn_cancel_init(&c, &flag), 0);
  assert_int_equal(mn_cancel_begin(&c, 1, 5), 0);
  assert_int_equal(mn_cancel_request(&c, 1, 5), 1);
  assert_int_equal(flag, 1);
  assert_int_equal(mn_cancel_end(&c), 1);
  assert_int_equal(flag, 0); /* the next call starts clean */
  /* A late request for a call that ended is recorded and then dropped. */
  assert_int_equal(mn_cancel_request(&c, 1, 5), 0);
  assert_int_equal(mn_cancel_begin(&c, 1, 6), 0);
  assert_int_equal(flag, 0);
  assert_int_equal(mn_cancel_end(&c), 0);
  mn_cancel_close(&c);
}

static void another_session_forgets_requests(void **state) {
  atomic_int flag = 0;
  mn_cancel_t c;
  assert_int_equal(mn_cancel_init(&c, &flag), 0);
  assert_int_equal(mn_cancel_request(&c, 1, 9), 0);
  assert_int_equal(mn_cancel_begin(&c, 2, 9), 0); /* seq 9 of session 2 is another call */
  assert_int_equal(mn_cancel_end(&c), 0);
  mn_cancel_close(&c);
}

/* A session another controller took over: its running call gets the flag, and none of its calls starts again. */
static void retired_session_is_stopped(void **state) {
  atomic_int flag = 0;
  mn_cancel_t c;
  assert_int_equal(mn_cancel_init(&c, &flag), 0);
  assert_int_equal(mn_cancel_begin(&c, 1, 5), 0);
  mn_cancel_retire(&c, 1);
  assert_int_equal(flag, 1);
  assert_int_equal(mn_cancel_end(&c), 1);
  assert_int_equal(flag, 0);
  assert_int_equal(mn_cancel_begin(&c, 1, 6), 1); /* queued behind it: answered without running */
  assert_int_equal(mn_cancel_end(&c), 0);
  assert_int_equal(mn_cancel_begin(&c, 2, 1), 0); /* the new session's calls run */
  assert_int_equal(flag, 0);
  assert_int_equal(mn_cancel_end(&c), 0);
  mn_cancel_retire(&c, 3); /* nothing running: nothing flagged */
  assert_int_equal(flag, 0);
  mn_cancel_close(&c);
}

static void table_full_is_refused(void **state) {
  atomic_int flag = 0;
  mn_cancel_t c;
  assert_int_equal(mn_cancel_init(&c, &flag), 0);
  for (uint64_t s = 1; s <= MN_CANCEL_MAX; s++) assert_int_equal(mn_cancel_request(&c, 1, 100 + s), 0);
  assert_int_equal(mn_cancel_request(&c, 1, 99999), MN_ELIMIT);
  assert_int_equal(mn_cancel_begin(&c, 1, 101), 1);
  assert_int_equal(mn_cancel_end(&c), 0);
  assert_int_equal(mn_cancel_request(&c, 1, 99999), 0); /* room again */
  mn_cancel_close(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(queued_call_is_cancelled_before_it_runs),
      cmocka_unit_test(running_call_gets_its_flag_and_only_it),
      cmocka_unit_test(another_session_forgets_requests),
      cmocka_unit_test(retired_session_is_stopped),
      cmocka_unit_test(table_full_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
