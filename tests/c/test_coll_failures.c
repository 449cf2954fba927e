/*
 * test_coll_failures.c - unit tests for host/coll: collectives that fail
 * (mismatched calls, an unsupported dtype, a peer that leaves, never comes
 * or never joins), proc-to-proc copies, and a data port that refuses
 * strangers, on the instances and member threads of coll_members.h.
 */
#include "coll_members.h"

/* ---- failures ------------------------------------------------------------------- */

/* Member 0 all_reduces, member 1 broadcasts: both learn what the other called. */
static void body_mismatch(member_t *m) {
  mk_tensor_t *t = tensor_new(MK_F32, m->me == 0 ? 1024 : 4);
  if (join(m) == 0) {
    if (m->me == 0) m->rc = mn_coll_all_reduce(m->c, m->gid, t, MN_COLL_SUM, m->err, sizeof(m->err), &m->mismatch);
    else m->rc = mn_coll_broadcast(m->c, m->gid, t, 0, m->err, sizeof(m->err), &m->mismatch);
    char err[256];
    /* The group is torn down after the failure. */
    if (m->rc != 0 && mn_coll_barrier(m->c, m->gid, err, sizeof(err), NULL) == 0) m->rc = 0;
  }
  tensor_free(t);
}

static void test_mismatched_collectives_are_reported(void **state) {
  (void)state;
  member_t m[MAXM];
  for (int mode = CMA; mode <= SHM; mode++) {
    run_group(m, 2, body_mismatch, NULL, mode);
    for (int i = 0; i < 2; i++) {
      assert_int_equal(MN_EPEER, m[i].rc);
      assert_int_equal(1, m[i].mismatch);
      assert_true(m[i].seconds < 5);
    }
    assert_non_null(strstr(m[0].err, "rank 11 called broadcast(root 0, f32) of 16 bytes but rank 10 called "
                                     "all_reduce(sum, f32) of 4096 bytes"));
    assert_non_null(strstr(m[1].err, "rank 10 called all_reduce(sum, f32) of 4096 bytes but rank 11 called "
                                     "broadcast(root 0, f32) of 16 bytes"));
  }
}

/* Several hosts: members 0-2 all_reduce, member 3 broadcasts. The two that see the other call report the
 * mismatch; the two between them, already summing in shared memory, learn at once that their peers left. */
static void body_hosts_mismatch(member_t *m) {
  mk_tensor_t *t = tensor_new(MK_F32, m->me == 3 ? 4 : 100000);
  if (join(m) == 0) {
    if (m->me != 3) m->rc = mn_coll_all_reduce(m->c, m->gid, t, MN_COLL_SUM, m->err, sizeof(m->err), &m->mismatch);
    else m->rc = mn_coll_broadcast(m->c, m->gid, t, 0, m->err, sizeof(m->err), &m->mismatch);
  }
  tensor_free(t);
}

static void test_mismatch_across_hosts_fails_every_member_fast(void **state) {
  (void)state;
  static const char *const keys[MAXM] = {"A", "A", "B", "B"};
  host_keys = keys;
  member_t m[MAXM];
  run_group(m, 4, body_hosts_mismatch, NULL, SHM);
  host_keys = NULL;
  for (int i = 0; i < 4; i++) {
    assert_int_equal(MN_COLL_HOSTS, m[i].layout);
    if (m[i].rc >= 0) fail_msg("member %d succeeded", i);
    assert_true(m[i].seconds < 5);
  }
  assert_int_equal(1, m[0].mismatch);
  assert_int_equal(1, m[3].mismatch);
  assert_non_null(strstr(m[0].err, "broadcast(root 0, f32) of 16 bytes"));
}

/* A u8 tensor cannot be reduced: the member that sees it says so, the others hear why. */
static void body_bad_dtype(member_t *m) {
  mk_tensor_t *t = tensor_new(m->me == 1 ? MK_U8 : MK_F32, 16);
  if (join(m) == 0)
    m->rc = mn_coll_all_reduce(m->c, m->gid, t, MN_COLL_SUM, m->err, sizeof(m->err), &m->mismatch);
  tensor_free(t);
}

static void test_unsupported_dtype_fails_every_member_fast(void **state) {
  (void)state;
  member_t m[MAXM];
  for (int mode = CMA; mode <= SHM; mode++) {
    run_group(m, 3, body_bad_dtype, NULL, mode);
    for (int i = 0; i < 3; i++) {
      assert_true(m[i].rc < 0);
      assert_true(m[i].seconds < 5);
    }
    assert_int_equal(MN_EINVAL, m[1].rc); /* its own argument */
    assert_int_equal(MN_EPEER, m[2].rc);  /* told why member 1 gave up */
    assert_non_null(strstr(m[1].err, "all_reduce does not support dtype u8 (f32, f64, i32, i64)"));
    assert_non_null(strstr(m[2].err, "rank 11 gave up on group"));
    assert_non_null(strstr(m[2].err, "dtype u8"));
  }
}

/* Polls *flag every millisecond until it is set; 0, or -1 with err saying what it waited for after
 * `seconds` (a member thread cannot fail the test itself: cmocka's asserts belong to the main thread). */
static int wait_flag(atomic_int *flag, double seconds, const char *what, char *err, size_t errlen) {
  double deadline = mn_now_s() + seconds;
  while (!atomic_load(flag)) {
    if (mn_now_s() > deadline) {
      snprintf(err, errlen, "timed out after %g s waiting for %s", seconds, what);
      return -1;
    }
    usleep(1000);
  }
  return 0;
}

/* Member 1 leaves (its links close) once member 0 has begun a large all_reduce (arg: it says so). */
static void body_peer_leaves(member_t *m) {
  atomic_int *begun = m->arg;
  mk_tensor_t *t = tensor_new(MK_F32, 1 << 20);
  if (join(m) == 0) {
    if (m->me == 0) {
      atomic_store(begun, 1);
      m->rc = mn_coll_all_reduce(m->c, m->gid, t, MN_COLL_SUM, m->err, sizeof(m->err), &m->mismatch);
    } else if ((m->rc = wait_flag(begun, 10, "member 0's all_reduce", m->err, sizeof(m->err))) == 0) {
      m->rc = mn_coll_group_free(m->c, m->gid);
    }
  }
  tensor_free(t);
}

static void test_a_peer_that_leaves_gives_an_error_not_a_hang(void **state) {
  (void)state;
  for (int cma = TCP; cma <= SHM; cma++) {
    member_t m[MAXM];
    atomic_int begun;
    atomic_init(&begun, 0);
    run_group(m, 2, body_peer_leaves, &begun, cma);
    if (m[1].rc != 0) fail_msg("member 1: %s", m[1].err);
    assert_int_equal(MN_EPEER, m[0].rc);
    assert_non_null(strstr(m[0].err, "rank 11 (127.0.0.1:"));
    assert_non_null(strstr(m[0].err, "closed its link during all_reduce"));
    assert_true(m[0].seconds < 5);
  }
}

/* Member 1 never calls the collective, but stays (its links open) until member 0 has given up after
 * the timeout (arg: member 0 says so); member 0 names it. */
static void body_peer_absent(member_t *m) {
  atomic_int *gave_up = m->arg;
  mk_tensor_t *t = tensor_new(MK_F64, 10);
  int joined = join(m) == 0;
  if (joined && m->me == 0) {
    mn_coll_set_timeout(m->c, 0.3);
    m->rc = mn_coll_all_reduce(m->c, m->gid, t, MN_COLL_SUM, m->err, sizeof(m->err), &m->mismatch);
    mn_coll_set_timeout(m->c, 20);
  }
  if (m->me == 0) atomic_store(gave_up, 1);
  if (joined && m->me == 1) m->rc = wait_flag(gave_up, 10, "member 0 to give up", m->err, sizeof(m->err));
  tensor_free(t);
}

static void test_a_peer_that_never_comes_times_out_by_name(void **state) {
  (void)state;
  member_t m[MAXM];
  for (int mode = CMA; mode <= SHM; mode++) {
    atomic_int gave_up;
    atomic_init(&gave_up, 0);
    run_group(m, 2, body_peer_absent, &gave_up, mode);
    if (m[1].rc != 0) fail_msg("member 1: %s", m[1].err);
    assert_int_equal(MN_ETIMEDOUT, m[0].rc);
    assert_non_null(strstr(m[0].err, mode == SHM ? "no progress from rank 11" : "no data from rank 11"));
    assert_non_null(strstr(m[0].err, "MONARCH_COLL_TIMEOUT"));
    mn_coll_group_free(inst[1], m[1].gid);
  }
}

static void body_group_alone(member_t *m) {
  if (m->me != 0) return;
  mn_coll_set_timeout(m->c, 0.3);
  join(m);
  mn_coll_set_timeout(m->c, 20);
}

static void test_group_setup_names_the_member_that_never_joins(void **state) {
  (void)state;
  member_t m[MAXM];
  run_group(m, 3, body_group_alone, NULL, 1);
  assert_int_equal(MN_ETIMEDOUT, m[0].rc);
  assert_non_null(strstr(m[0].err, "rank 12 (127.0.0.1:"));
  assert_non_null(strstr(m[0].err, "did not connect within"));
  char err[256];
  assert_int_equal(MN_ENOTFOUND, mn_coll_barrier(inst[0], m[0].gid, err, sizeof(err), NULL));
  assert_non_null(strstr(err, "has no group"));
}

/* ---- proc-to-proc copies ----------------------------------------------------------- */

typedef struct {
  mk_tensor_t *src, *dst;
  uint64_t tag;
} copy_case_t;

static void body_copy(member_t *m) {
  copy_case_t *k = m->arg;
  if (m->me == 0) m->rc = mn_coll_send(m->c, k->src, addr[1], k->tag, m->err, sizeof(m->err));
  else m->rc = mn_coll_recv(m->c, k->dst, k->tag, m->err, sizeof(m->err));
}

/* Over TCP, and (on one host, from 1 MB) copied by the receiver straight out of the sender's memory. */
static void test_copy_lands_in_place(void **state) {
  (void)state;
  for (int cma = TCP; cma <= CMA; cma++) {
    copy_case_t k = {tensor_new(MK_F32, 3 << 20), tensor_new(MK_F32, 3 << 20), 77 + (uint64_t)cma};
    member_t m[MAXM];
    fill(k.src, 5 + cma);
    void *where = k.dst->data;
    run_group(m, 2, body_copy, &k, cma);
    for (int i = 0; i < 2; i++) {
      if (m[i].rc != 0) fail_msg("cma=%d member %d: %s", cma, i, m[i].err);
    }
    assert_ptr_equal(where, k.dst->data);
    assert_memory_equal(k.src->data, k.dst->data, k.src->nbytes);
    tensor_free(k.src);
    tensor_free(k.dst);
  }
}

static void test_copy_size_mismatch_fails_both_sides(void **state) {
  (void)state;
  copy_case_t k = {tensor_new(MK_F32, 100), tensor_new(MK_F32, 50), 79};
  member_t m[MAXM];
  run_group(m, 2, body_copy, &k, 1);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(MN_EPEER, m[i].rc);
    assert_non_null(strstr(m[i].err, "rank 10 sends f32 data of 400 bytes but the destination tensor on rank 11 is "
                                     "f32 of 200 bytes"));
  }
  tensor_free(k.src);
  tensor_free(k.dst);
}

static void test_recv_without_sender_times_out(void **state) {
  (void)state;
  mk_tensor_t *t = tensor_new(MK_U8, 10);
  char err[512];
  mn_coll_set_timeout(inst[2], 0.2);
  assert_int_equal(MN_ETIMEDOUT, mn_coll_recv(inst[2], t, 12345, err, sizeof(err)));
  mn_coll_set_timeout(inst[2], 20);
  assert_non_null(strstr(err, "no sender connected"));
  tensor_free(t);
}

/* ---- the data port refuses strangers -------------------------------------------------- */

static void test_garbage_and_wrong_tokens_do_not_hurt(void **state) {
  (void)state;
  /* Raw garbage instead of AUTH. */
  int fd = mn_sock_connect("127.0.0.1", mn_coll_port(inst[0]));
  assert_true(fd >= 0);
  char junk[4096];
  memset(junk, 0xff, sizeof(junk));
  assert_int_equal(0, mn_write_all(fd, junk, sizeof(junk)));
  close(fd);
  /* A peer with another token cannot open a link. */
  mn_auth_t other;
  mn_coll_t *stranger;
  char err[512];
  assert_int_equal(0, mn_auth_init(&other, "not-the-token", 13));
  assert_int_equal(0, mn_coll_open(&stranger, "127.0.0.1", &other, 99, err, sizeof(err)));
  mn_coll_set_timeout(stranger, 2);
  mk_tensor_t *t = tensor_new(MK_U8, 10);
  assert_int_equal(MN_EAUTH, mn_coll_send(stranger, t, addr[0], 5, err, sizeof(err)));
  assert_non_null(strstr(err, "handshake"));
  mn_coll_close(stranger);
  tensor_free(t);
  /* The instance still works. */
  check_all_reduce(2, MK_F32, 1000, MN_COLL_SUM, 1);
}

int main(void) {
  /* One group (so the runner counts every test); the live tests share the group's instances. */
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_mismatched_collectives_are_reported),
    cmocka_unit_test(test_unsupported_dtype_fails_every_member_fast),
    cmocka_unit_test(test_mismatch_across_hosts_fails_every_member_fast),
    cmocka_unit_test(test_a_peer_that_leaves_gives_an_error_not_a_hang),
    cmocka_unit_test(test_a_peer_that_never_comes_times_out_by_name),
    cmocka_unit_test(test_group_setup_names_the_member_that_never_joins),
    cmocka_unit_test(test_copy_lands_in_place),
    cmocka_unit_test(test_copy_size_mismatch_fails_both_sides),
    cmocka_unit_test(test_recv_without_sender_times_out),
    cmocka_unit_test(test_garbage_and_wrong_tokens_do_not_hurt),
  };
  return cmocka_run_group_tests_name("coll_failures", tests, open_all, close_all);
}
