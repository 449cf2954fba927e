/*
 * test_collective.c - unit tests for host/coll/collective.c and coll_*.c: the
 * pure pieces (reduction ops, segment arithmetic, step headers), then real
 * collectives between several mn_coll_t instances in this one process, one
 * thread per member, over real loopback sockets - over TCP, with same-host
 * copies (process_vm_readv, which works on our own pid too) and in shared
 * memory - on one host and on several (coll_members.h). test_coll_failures.c
 * has the failures, proc-to-proc copies and strangers on the data port.
 */
#include "coll_members.h"

/* ---- pure pieces ------------------------------------------------------------ */

static void test_op_names(void **state) {
  (void)state;
  assert_int_equal(MN_COLL_SUM, mn_coll_op_parse("sum", 3));
  assert_int_equal(MN_COLL_MAX, mn_coll_op_parse("max", 3));
  assert_int_equal(MN_COLL_MIN, mn_coll_op_parse("min", 3));
  assert_int_equal(MN_COLL_AVG, mn_coll_op_parse("avg", 3));
  assert_int_equal(MN_EINVAL, mn_coll_op_parse("prod", 4));
  assert_int_equal(MN_EINVAL, mn_coll_op_parse("su", 2));
  assert_string_equal("avg", mn_coll_op_name(MN_COLL_AVG));
  assert_string_equal("reduce_scatter", mn_coll_kind_name(MN_COLL_REDUCE_SCATTER));
  assert_true(mn_coll_dtype_ok(MK_I64));
  assert_false(mn_coll_dtype_ok(MK_U8));
  assert_false(mn_coll_dtype_ok(MK_F16));
}

/* 37 elements: two vector blocks and a tail. */
static void test_reduce_f32_in_place(void **state) {
  (void)state;
  float a[37], b[37];
  for (int i = 0; i < 37; i++) {
    a[i] = (float)i;
    b[i] = (float)(100 - 3 * i);
  }
  float s[37], mx[37], mn[37];
  memcpy(s, a, sizeof(a));
  mn_coll_reduce(s, s, b, 37, MK_F32, MN_COLL_SUM);
  mn_coll_reduce(mx, a, b, 37, MK_F32, MN_COLL_MAX);
  mn_coll_reduce(mn, a, b, 37, MK_F32, MN_COLL_MIN);
  for (int i = 0; i < 37; i++) {
    assert_true(s[i] == a[i] + b[i]);
    assert_true(mx[i] == fmaxf(a[i], b[i]));
    assert_true(mn[i] == fminf(a[i], b[i]));
  }
}

static void test_reduce_f64_and_avg(void **state) {
  (void)state;
  double a[20], b[20];
  for (int i = 0; i < 20; i++) a[i] = 1.5 * i, b[i] = 0.5 * i;
  mn_coll_reduce(a, a, b, 20, MK_F64, MN_COLL_AVG); /* avg reduces as a sum */
  mn_coll_divide(a, 20, MK_F64, 2);
  for (int i = 0; i < 20; i++) assert_true(a[i] == (double)i);
}

static void test_reduce_ints_wrap_and_truncate(void **state) {
  (void)state;
  int32_t a[3] = {INT32_MAX, -7, 5}, b[3] = {1, 0, -9};
  mn_coll_reduce(a, a, b, 3, MK_I32, MN_COLL_SUM);
  assert_int_equal(INT32_MIN, a[0]); /* wraps, no undefined behaviour */
  mn_coll_divide(a + 1, 2, MK_I32, 2);
  assert_int_equal(-3, a[1]); /* truncates toward zero */
  assert_int_equal(-2, a[2]);
  int64_t x[18], y[18];
  for (int i = 0; i < 18; i++) x[i] = (int64_t)i << 40, y[i] = -(int64_t)i;
  mn_coll_reduce(x, x, y, 18, MK_I64, MN_COLL_MIN);
  for (int i = 0; i < 18; i++) assert_true(x[i] == (i == 0 ? 0 : -(int64_t)i));
  int64_t big[1] = {INT64_MAX}, one[1] = {1};
  mn_coll_reduce(big, big, one, 1, MK_I64, MN_COLL_SUM);
  assert_true(big[0] == INT64_MIN);
}

static void test_segments_cover_in_order(void **state) {
  (void)state;
  size_t counts[] = {0, 1, 3, 7, 100, 1000003};
  for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
    for (int n = 1; n <= 9; n++) {
      size_t next = 0, first, len;
      for (int i = 0; i < n; i++) {
        mn_coll_segment(counts[ci], n, i, &first, &len);
        assert_int_equal(next, first);
        assert_true(len == counts[ci] / n || len == counts[ci] / n + 1);
        assert_true(len == counts[ci] / n + ((size_t)i < counts[ci] % n ? 1 : 0));
        next = first + len;
      }
      assert_int_equal(counts[ci], next);
    }
  }
}

static void test_header_round_trip_and_magic(void **state) {
  (void)state;
  mn_coll_hdr_t h = {MN_COLL_BROADCAST, 0, MK_F64, 7, 3, 0x123456789ull, 1ull << 40}, g;
  unsigned char b[MN_COLL_HDR_LEN];
  mn_coll_hdr_pack(&h, b);
  assert_int_equal(0, mn_coll_hdr_unpack(b, &g));
  assert_int_equal(h.kind, g.kind);
  assert_int_equal(h.dtype, g.dtype);
  assert_int_equal(h.rank, g.rank);
  assert_int_equal(h.root, g.root);
  assert_true(h.seq == g.seq && h.nbytes == g.nbytes);
  b[0] ^= 1;
  assert_int_equal(MN_EPROTO, mn_coll_hdr_unpack(b, &g));
}

static void test_header_check_names_both_calls(void **state) {
  (void)state;
  char err[512];
  mn_coll_hdr_t mine = {MN_COLL_BROADCAST, 0, MK_F32, 1, 0, 5, 16};
  mn_coll_hdr_t theirs = {MN_COLL_ALL_REDUCE, MN_COLL_SUM, MK_F32, 2, 0, 5, 4096};
  assert_int_equal(0, mn_coll_hdr_check(&mine, &mine, err, sizeof(err)));
  assert_int_equal(MN_EPEER, mn_coll_hdr_check(&mine, &theirs, err, sizeof(err)));
  assert_non_null(strstr(err, "rank 2 called all_reduce(sum, f32) of 4096 bytes but rank 1 called "
                              "broadcast(root 0, f32) of 16 bytes"));
  mn_coll_hdr_t other_root = mine;
  other_root.root = 1;
  assert_int_equal(MN_EPEER, mn_coll_hdr_check(&mine, &other_root, err, sizeof(err)));
  mn_coll_hdr_t other_op = theirs;
  other_op.op = MN_COLL_MAX;
  assert_int_equal(MN_EPEER, mn_coll_hdr_check(&theirs, &other_op, err, sizeof(err)));
  assert_non_null(strstr(err, "all_reduce(max, f32)"));
  mn_coll_hdr_t later = theirs;
  later.seq = 6;
  assert_int_equal(MN_EPEER, mn_coll_hdr_check(&theirs, &later, err, sizeof(err)));
  assert_non_null(strstr(err, "#6"));
}

/* A region offered by a confused or hostile member 0 is refused with a reason, never mapped blindly. */
static void test_shm_attach_refuses_what_is_not_a_region(void **state) {
  (void)state;
  char err[256];
  mn_shm_t *s = NULL;
  size_t piece = mn_shm_piece_for(2, 0);
  int dn = open("/dev/null", O_RDWR);
  assert_true(dn >= 0);
  assert_int_equal(MN_EINVAL, mn_shm_attach(&s, 2, 1, (long)getpid(), dn, piece, 7, 9, err, sizeof(err)));
  assert_non_null(strstr(err, "not a regular file"));
  close(dn);
  FILE *tf = tmpfile();
  assert_non_null(tf);
  assert_int_equal(0, ftruncate(fileno(tf), 64 << 20));
  assert_int_equal(MN_EINVAL, mn_shm_attach(&s, 2, 1, (long)getpid(), fileno(tf), piece, 7, 9, err, sizeof(err)));
  assert_non_null(strstr(err, "is not this group's region"));
  assert_int_equal(MN_EINVAL, mn_shm_attach(&s, 2, 1, (long)getpid(), fileno(tf), 100, 7, 9, err, sizeof(err)));
  assert_non_null(strstr(err, "bad geometry"));
  fclose(tf);
  assert_null(s);
  /* The real thing maps, and its geometry must match. */
  mn_shm_t *r;
  assert_int_equal(0, mn_shm_create(&r, 2, piece, 7, 9, err, sizeof(err)));
  assert_int_equal(MN_EINVAL, mn_shm_attach(&s, 3, 1, (long)getpid(), mn_shm_fd(r), piece, 7, 9, err, sizeof(err)));
  assert_non_null(strstr(err, "too small"));
  /* Another group's region, or the right one without its nonce, is not this group's. */
  assert_int_equal(MN_EINVAL, mn_shm_attach(&s, 2, 1, (long)getpid(), mn_shm_fd(r), piece, 8, 9, err, sizeof(err)));
  assert_non_null(strstr(err, "is not this group's region"));
  assert_int_equal(MN_EINVAL, mn_shm_attach(&s, 2, 1, (long)getpid(), mn_shm_fd(r), piece, 7, 10, err, sizeof(err)));
  assert_non_null(strstr(err, "is not this group's region"));
  assert_int_equal(0, mn_shm_attach(&s, 2, 1, (long)getpid(), mn_shm_fd(r), piece, 7, 9, err, sizeof(err)));
  mn_shm_close(s);
  mn_shm_close(r);
}

static const mk_dtype_t reducible[] = {MK_F32, MK_F64, MK_I32, MK_I64};

/* Small tensors take the star through member 0. */
static void test_all_reduce_small_every_op_and_dtype(void **state) {
  (void)state;
  for (int n = 2; n <= MAXM; n++)
    for (int d = 0; d < 4; d++)
      for (int op = 0; op < 4; op++)
        for (int mode = CMA; mode <= SHM; mode++) check_all_reduce(n, reducible[d], 1000, op, mode);
}

/* Large tensors take the ring (over 1 MB: same-host copies when on); an odd count makes uneven segments. */
static void test_all_reduce_ring_every_op_tcp_and_same_host(void **state) {
  (void)state;
  for (int cma = TCP; cma <= SHM; cma++)
    for (int n = 2; n <= MAXM; n++)
      for (int op = 0; op < 4; op++) check_all_reduce(n, op % 2 ? MK_I64 : MK_F32, 300007, op, cma);
  check_all_reduce(3, MK_F64, 1 << 20, MN_COLL_AVG, CMA); /* several chunks per segment */
  check_all_reduce(3, MK_F64, 1 << 20, MN_COLL_AVG, SHM); /* many pieces, both buffers */
  check_all_reduce(4, MK_I32, 1 << 20, MN_COLL_SUM, 0);
}

static void test_all_reduce_one_member_is_identity(void **state) {
  (void)state;
  check_all_reduce(1, MK_F32, 100, MN_COLL_AVG, 1);
}

typedef struct {
  mk_tensor_t *src[MAXM], *dst[MAXM];
  int root, op;
} xcase_t;

static void body_broadcast(member_t *m) {
  xcase_t *k = m->arg;
  if (join(m) != 0) return;
  m->rc = mn_coll_broadcast(m->c, m->gid, k->src[m->me], k->root, m->err, sizeof(m->err), &m->mismatch);
}

static void test_broadcast_from_a_nonzero_root(void **state) {
  (void)state;
  for (int cma = TCP; cma <= SHM; cma++) {
    int64_t sizes[] = {5, 3000001};
    for (int s = 0; s < 2; s++) {
      xcase_t k = {.root = 2};
      member_t m[MAXM];
      for (int i = 0; i < 4; i++) {
        k.src[i] = tensor_new(MK_U8, sizes[s]);
        fill(k.src[i], i);
      }
      run_group(m, 4, body_broadcast, &k, cma);
      for (int i = 0; i < 4; i++) {
        if (m[i].rc != 0) fail_msg("member %d: %s", i, m[i].err);
        for (int64_t e = 0; e < sizes[s]; e++) assert_int_equal((uint8_t)(2 + e), ((uint8_t *)k.src[i]->data)[e]);
      }
      for (int i = 0; i < 4; i++) tensor_free(k.src[i]);
    }
  }
}

static void body_all_gather(member_t *m) {
  xcase_t *k = m->arg;
  if (join(m) != 0) return;
  m->rc = mn_coll_all_gather(m->c, m->gid, k->src[m->me], k->dst[m->me], m->err, sizeof(m->err), &m->mismatch);
}

static void test_all_gather_in_member_order(void **state) {
  (void)state;
  for (int cma = TCP; cma <= SHM; cma++) {
    for (int n = 2; n <= MAXM; n++) {
      xcase_t k;
      member_t m[MAXM];
      int64_t per = 150001; /* 1.2 MB: over MN_COLL_CMA_MIN */
      for (int i = 0; i < n; i++) {
        k.src[i] = tensor_new(MK_F64, per);
        k.dst[i] = tensor_new(MK_F64, per * n);
        fill(k.src[i], i);
      }
      run_group(m, n, body_all_gather, &k, cma);
      for (int i = 0; i < n; i++) {
        if (m[i].rc != 0) fail_msg("member %d: %s", i, m[i].err);
        for (int b = 0; b < n; b++)
          assert_memory_equal(k.src[b]->data, (char *)k.dst[i]->data + (size_t)b * k.src[b]->nbytes, k.src[b]->nbytes);
      }
      for (int i = 0; i < n; i++) tensor_free(k.src[i]), tensor_free(k.dst[i]);
    }
  }
}

static void body_reduce_scatter(member_t *m) {
  xcase_t *k = m->arg;
  if (join(m) != 0) return;
  m->rc = mn_coll_reduce_scatter(m->c, m->gid, k->src[m->me], k->dst[m->me], k->op, m->err, sizeof(m->err),
                                 &m->mismatch);
}

static void test_reduce_scatter_leaves_src_alone(void **state) {
  (void)state;
  for (int cma = TCP; cma <= SHM; cma++) {
    for (int n = 2; n <= MAXM; n++) {
      int ops[] = {MN_COLL_SUM, MN_COLL_AVG, MN_COLL_MAX};
      for (int o = 0; o < 3; o++) {
        xcase_t k = {.op = ops[o]};
        member_t m[MAXM];
        int64_t per = 300001; /* 1.2 MB per block */
        for (int i = 0; i < n; i++) {
          k.src[i] = tensor_new(MK_I32, per * n);
          k.dst[i] = tensor_new(MK_I32, per);
          fill(k.src[i], i);
        }
        run_group(m, n, body_reduce_scatter, &k, cma);
        for (int i = 0; i < n; i++) {
          if (m[i].rc != 0) fail_msg("member %d: %s", i, m[i].err);
          for (int64_t e = 0; e < per; e++) {
            double want = expect(ops[o], n, i * per + e, MK_I32);
            if (get(k.dst[i], e) != want)
              fail_msg("n=%d op %s member %d element %lld: got %g want %g", n, mn_coll_op_name(ops[o]), i,
                       (long long)e, get(k.dst[i], e), want);
          }
          for (int64_t e = 0; e < per * n; e += 997) assert_true(get(k.src[i], e) == value(i, e));
        }
        for (int i = 0; i < n; i++) tensor_free(k.src[i]), tensor_free(k.dst[i]);
      }
    }
  }
}

/* Member 0 is slow to arrive (the sleep is the lateness under test); nobody may leave the barrier
 * before it comes: each member that leaves checks that member 0 said it arrived (arg). */
static void body_barrier(member_t *m) {
  atomic_int *arrived = m->arg;
  if (join(m) != 0) return;
  if (m->me == 0) {
    usleep(200 * 1000);
    atomic_store(arrived, 1);
  }
  double t0 = mn_now_s();
  m->rc = mn_coll_barrier(m->c, m->gid, m->err, sizeof(m->err), &m->mismatch);
  m->seconds = mn_now_s() - t0;
  if (m->rc == 0 && !atomic_load(arrived)) {
    m->rc = -1;
    snprintf(m->err, sizeof(m->err), "left the barrier before member 0 arrived");
  }
}

static void test_barrier_waits_for_the_last_member(void **state) {
  (void)state;
  member_t m[MAXM];
  for (int mode = CMA; mode <= SHM; mode++) {
    atomic_int arrived;
    atomic_init(&arrived, 0);
    run_group(m, 3, body_barrier, &arrived, mode);
    for (int i = 0; i < 3; i++) {
      if (m[i].rc != 0) fail_msg("mode %d member %d: %s", mode, i, m[i].err);
    }
    assert_true(m[1].seconds > 0.15 && m[2].seconds > 0.15);
  }
}

/* Many collectives in a row on one group keep the streams in step. */
static void body_sequence(member_t *m) {
  mk_tensor_t *t = tensor_new(MK_F32, 200000), *s = tensor_new(MK_F32, 1000);
  if (join(m) != 0) goto out;
  for (int it = 0; it < 20 && m->rc == 0; it++) {
    fill(t, m->me);
    fill(s, m->me);
    m->rc = mn_coll_all_reduce(m->c, m->gid, it % 2 ? t : s, MN_COLL_SUM, m->err, sizeof(m->err), &m->mismatch);
    if (m->rc == 0) m->rc = mn_coll_broadcast(m->c, m->gid, t, it % m->n, m->err, sizeof(m->err), &m->mismatch);
    if (m->rc == 0 && it % 5 == 0) m->rc = mn_coll_barrier(m->c, m->gid, m->err, sizeof(m->err), &m->mismatch);
  }
out:
  tensor_free(t);
  tensor_free(s);
}

/* Ring all_reduces back to back: the next one's header may arrive in the same read as the last control message. */
static void body_stream(member_t *m) {
  mk_tensor_t *t = tensor_new(MK_F32, 300000);
  if (join(m) != 0) goto out;
  for (int it = 0; it < 200 && m->rc == 0; it++) {
    for (int64_t i = 0; i < t->numel; i++) ((float *)t->data)[i] = (float)(m->me + it);
    m->rc = mn_coll_all_reduce(m->c, m->gid, t, MN_COLL_MAX, m->err, sizeof(m->err), &m->mismatch);
    if (m->rc == 0 && ((float *)t->data)[t->numel - 1] != (float)(m->n - 1 + it)) {
      snprintf(m->err, sizeof(m->err), "iteration %d: wrong result %g", it, ((float *)t->data)[t->numel - 1]);
      m->rc = -1;
    }
  }
out:
  tensor_free(t);
}

static void test_ring_all_reduces_stream_back_to_back(void **state) {
  (void)state;
  for (int cma = TCP; cma <= SHM; cma++) {
    for (int n = 2; n <= 3; n++) {
      member_t m[MAXM];
      run_group(m, n, body_stream, NULL, cma);
      for (int i = 0; i < n; i++) {
        if (m[i].rc != 0) fail_msg("cma=%d n=%d member %d: %s", cma, n, i, m[i].err);
      }
    }
  }
}

static void test_collectives_back_to_back(void **state) {
  (void)state;
  for (int cma = TCP; cma <= SHM; cma++) {
    member_t m[MAXM];
    run_group(m, 4, body_sequence, NULL, cma);
    for (int i = 0; i < 4; i++) {
      if (m[i].rc != 0) fail_msg("member %d: %s", i, m[i].err);
    }
  }
}

/* ---- several hosts -------------------------------------------------------------- */

/*
 * Members on several "hosts" (host keys), some with company: all_reduce sums
 * per host in shared memory and across hosts over a ring of leaders. Every
 * op, dtype and host pattern gives the exact result, the same on every member.
 */
static void test_all_reduce_across_hosts_every_op_and_pattern(void **state) {
  (void)state;
  static const char *const patterns[][MAXM] = {
      {"A", "A", "B", "B"}, {"A", "B", "A", "B"}, {"A", "A", "A", "B"}, {"A", "B", "B", "B"}, {"A", "B", "C", "C"}};
  for (size_t p = 0; p < sizeof(patterns) / sizeof(patterns[0]); p++) {
    host_keys = patterns[p];
    for (int op = 0; op < 4; op++)
      for (int d = 0; d < 4; d++)
        check_all_reduce_laid_out(MAXM, reducible[d], d % 2 ? 1000 : 300007, op, SHM, MN_COLL_HOSTS);
  }
  host_keys = NULL;
}

/* One member per host: nothing to share, the group stays flat. */
static void test_one_member_per_host_stays_flat(void **state) {
  (void)state;
  static const char *const keys[MAXM] = {"A", "B", "C", "D"};
  host_keys = keys;
  check_all_reduce_laid_out(MAXM, MK_F32, 1000, MN_COLL_SUM, SHM, MN_COLL_FLAT);
  host_keys = NULL;
}

/* The other collectives keep the ring on a several-host group, and all of them stay in step. */
static void test_collectives_back_to_back_across_hosts(void **state) {
  (void)state;
  static const char *const keys[MAXM] = {"A", "A", "B", "B"};
  host_keys = keys;
  member_t m[MAXM];
  run_group(m, 4, body_sequence, NULL, SHM);
  for (int i = 0; i < 4; i++) {
    if (m[i].rc != 0) fail_msg("member %d: %s", i, m[i].err);
    assert_int_equal(MN_COLL_HOSTS, m[i].layout);
  }
  host_keys = NULL;
}

int main(void) {
  /* One group (so the runner counts every test); the live tests share the group's instances. */
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_op_names),
    cmocka_unit_test(test_reduce_f32_in_place),
    cmocka_unit_test(test_reduce_f64_and_avg),
    cmocka_unit_test(test_reduce_ints_wrap_and_truncate),
    cmocka_unit_test(test_segments_cover_in_order),
    cmocka_unit_test(test_header_round_trip_and_magic),
    cmocka_unit_test(test_header_check_names_both_calls),
    cmocka_unit_test(test_shm_attach_refuses_what_is_not_a_region),
    cmocka_unit_test(test_all_reduce_small_every_op_and_dtype),
    cmocka_unit_test(test_all_reduce_ring_every_op_tcp_and_same_host),
    cmocka_unit_test(test_all_reduce_one_member_is_identity),
    cmocka_unit_test(test_broadcast_from_a_nonzero_root),
    cmocka_unit_test(test_all_gather_in_member_order),
    cmocka_unit_test(test_reduce_scatter_leaves_src_alone),
    cmocka_unit_test(test_barrier_waits_for_the_last_member),
    cmocka_unit_test(test_collectives_back_to_back),
    cmocka_unit_test(test_all_reduce_across_hosts_every_op_and_pattern),
    cmocka_unit_test(test_one_member_per_host_stays_flat),
    cmocka_unit_test(test_collectives_back_to_back_across_hosts),
    cmocka_unit_test(test_ring_all_reduces_stream_back_to_back),
  };
  return cmocka_run_group_tests_name("collective", tests, open_all, close_all);
}
