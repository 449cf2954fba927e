/* test_agent_pids.c - the agent's live procs by pid (host/agent/agent_pids.c), against a plain list. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "agent_int.h"

#define NPROCS 3000 /* enough for several doublings of the table */

static aproc_t *procs_with_pids(int n, int first, int step) {
  aproc_t *p = calloc((size_t)n, sizeof(*p));
  assert_non_null(p);
  for (int i = 0; i < n; i++) p[i].proc.pid = first + i * step;
  return p;
}

static void an_empty_table_finds_nothing(void **state) {
  agent_t a;
  memset(&a, 0, sizeof(a));
  assert_null(mn__agent_pids_find(&a, 1));
  aproc_t p;
  memset(&p, 0, sizeof(p));
  p.proc.pid = 7;
  mn__agent_pids_remove(&a, &p); /* not there: nothing happens */
  mn__agent_pids_free(&a);
}

static void each_proc_is_found_by_its_pid_as_the_table_grows(void **state) {
  agent_t a;
  memset(&a, 0, sizeof(a));
  aproc_t *p = procs_with_pids(NPROCS, 1000, 1); /* pids come in runs */
  for (int i = 0; i < NPROCS; i++) {
    assert_int_equal(mn__agent_pids_reserve(&a), 0);
    mn__agent_pids_add(&a, &p[i]);
  }
  assert_int_equal(a.pids.count, NPROCS);
  assert_true(a.pids.cap >= 2 * NPROCS);
  for (int i = 0; i < NPROCS; i++) assert_ptr_equal(mn__agent_pids_find(&a, 1000 + i), &p[i]);
  assert_null(mn__agent_pids_find(&a, 999));
  assert_null(mn__agent_pids_find(&a, 1000 + NPROCS));
  mn__agent_pids_free(&a);
  free(p);
}

/* Removals in an order unlike the insertions': every other entry must still be found (the backward shift). */
static void a_removed_proc_is_gone_and_the_others_stay(void **state) {
  agent_t a;
  memset(&a, 0, sizeof(a));
  aproc_t *p = procs_with_pids(NPROCS, 4096, 4096); /* multiples of a power of two: probes collide */
  for (int i = 0; i < NPROCS; i++) {
    assert_int_equal(mn__agent_pids_reserve(&a), 0);
    mn__agent_pids_add(&a, &p[i]);
  }
  char *gone = calloc(NPROCS, 1);
  assert_non_null(gone);
  for (int round = 0; round < NPROCS; round += 7) {
    int i = (round * 37) % NPROCS;
    if (gone[i]) continue;
    mn__agent_pids_remove(&a, &p[i]);
    gone[i] = 1;
    assert_null(mn__agent_pids_find(&a, p[i].proc.pid));
  }
  int left = 0;
  for (int i = 0; i < NPROCS; i++) {
    if (gone[i]) continue;
    left++;
    assert_ptr_equal(mn__agent_pids_find(&a, p[i].proc.pid), &p[i]);
  }
  assert_int_equal(a.pids.count, left);
  free(gone);
  mn__agent_pids_free(&a);
  free(p);
}

/* A pid handed out again before the old proc's exit was seen belongs to the new proc; the old one's exit keeps it. */
static void a_reused_pid_names_the_newest_proc(void **state) {
  agent_t a;
  memset(&a, 0, sizeof(a));
  aproc_t *p = procs_with_pids(2, 42, 0);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(mn__agent_pids_reserve(&a), 0);
    mn__agent_pids_add(&a, &p[i]);
  }
  assert_int_equal(a.pids.count, 1);
  assert_ptr_equal(mn__agent_pids_find(&a, 42), &p[1]);
  mn__agent_pids_remove(&a, &p[0]);
  assert_ptr_equal(mn__agent_pids_find(&a, 42), &p[1]);
  mn__agent_pids_remove(&a, &p[1]);
  assert_null(mn__agent_pids_find(&a, 42));
  assert_int_equal(a.pids.count, 0);
  mn__agent_pids_free(&a);
  free(p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(an_empty_table_finds_nothing),
      cmocka_unit_test(each_proc_is_found_by_its_pid_as_the_table_grows),
      cmocka_unit_test(a_removed_proc_is_gone_and_the_others_stay),
      cmocka_unit_test(a_reused_pid_names_the_newest_proc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
