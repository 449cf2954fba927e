/*
 * test_collective.c - unit tests for host/worker/collective.c and coll_*.c: the pure
 * pieces (reduction ops, segment arithmetic, step headers), then real
 * collectives between several mn_coll_t instances in this one process, one
 * thread per member, over real loopback sockets - both over TCP and with
 * same-host copies (process_vm_readv, which works on our own pid too).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "collective.h"
#include "coll_shm.h"
#include "registry.h"
#include "sock.h"

#define MAXM 4 /* most members a test group has */

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

/* ---- live groups: one thread per member ----------------------------------------- */

typedef struct member_s member_t;
typedef void (*body_fn)(member_t *m);
struct member_s {
  mn_coll_t *c;
  int me, n;
  uint64_t gid;
  body_fn body;
  void *arg;
  int rc, mismatch;
  int layout; /* mn_coll_layout_t */
  char err[1024];
  double seconds;
};

static mn_coll_t *inst[MAXM];
static char addr[MAXM][64];
static uint64_t next_gid = 1000;

static int open_all(void **state) {
  (void)state;
  mn_auth_t auth;
  char err[256];
  if (mn_auth_global_init() != 0 || mn_auth_init(&auth, "test-token", 10) != 0) return -1;
  for (int i = 0; i < MAXM; i++) {
    if (mn_coll_open(&inst[i], "127.0.0.1", &auth, 10 + i, err, sizeof(err)) != 0) {
      fprintf(stderr, "mn_coll_open: %s\n", err);
      return -1;
    }
    mn_coll_set_timeout(inst[i], 20);
    snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%d", mn_coll_port(inst[i]));
  }
  return 0;
}

static int close_all(void **state) {
  (void)state;
  for (int i = 0; i < MAXM; i++) mn_coll_close(inst[i]);
  return 0;
}

static void *member_main(void *arg) {
  member_t *m = arg;
  double t0 = mn_now_s();
  m->body(m);
  m->seconds = mn_now_s() - t0;
  return NULL;
}

/* Runs body on n members at once; each first joins a fresh group (unless body is run with gid 0). */
/* How members on one host move data: 0 TCP only, 1 the ring with direct copies, 2 shared memory (the default). */
enum { TCP = 0, CMA = 1, SHM = 2 };

/* Host keys for the next group (NULL: every member on one host); lets one process play several hosts. */
static const char *const *host_keys;

static void run_group(member_t *m, int n, body_fn body, void *arg, int mode) {
  pthread_t th[MAXM];
  uint64_t gid = ++next_gid;
  for (int i = 0; i < n; i++) {
    mn_coll_set_host_key(inst[i], host_keys != NULL ? host_keys[i] : "this-host");
    mn_coll_set_cma(inst[i], mode >= CMA);
    mn_coll_set_shm(inst[i], mode == SHM);
    memset(&m[i], 0, sizeof(m[i]));
    m[i].c = inst[i];
    m[i].me = i;
    m[i].n = n;
    m[i].gid = gid;
    m[i].body = body;
    m[i].arg = arg;
  }
  /* Group setup runs in the threads too: every member must join at once. */
  for (int i = 0; i < n; i++) assert_int_equal(0, pthread_create(&th[i], NULL, member_main, &m[i]));
  for (int i = 0; i < n; i++) assert_int_equal(0, pthread_join(th[i], NULL));
}

static int join(member_t *m) {
  const char *addrs[MAXM];
  int ranks[MAXM];
  for (int i = 0; i < m->n; i++) addrs[i] = addr[i], ranks[i] = 10 + i;
  m->rc = mn_coll_group(m->c, m->gid, m->me, m->n, addrs, ranks, m->err, sizeof(m->err));
  m->layout = mn_coll_group_layout(m->c, m->gid);
  return m->rc;
}

static mk_tensor_t *tensor_new(mk_dtype_t dt, int64_t numel) {
  mk_tensor_t *t = calloc(1, sizeof(*t));
  assert_non_null(t);
  t->dtype = dt;
  t->ndim = 1;
  t->shape[0] = numel;
  t->numel = numel;
  t->nbytes = (size_t)numel * mk_dtype_size(dt);
  t->device = -1;
  t->data = calloc(1, t->nbytes ? t->nbytes : 1);
  assert_non_null(t->data);
  return t;
}

static void tensor_free(mk_tensor_t *t) {
  free(t->data);
  free(t);
}

/* Rank-dependent values whose sums are exact in every dtype. */
static double value(int me, int64_t i) { return (double)((me + 1) * ((i % 1000) - 300)); }

static void fill(mk_tensor_t *t, int me) {
  for (int64_t i = 0; i < t->numel; i++) {
    double v = value(me, i);
    switch (t->dtype) {
    case MK_F32: ((float *)t->data)[i] = (float)v; break;
    case MK_F64: ((double *)t->data)[i] = v; break;
    case MK_I32: ((int32_t *)t->data)[i] = (int32_t)v; break;
    case MK_I64: ((int64_t *)t->data)[i] = (int64_t)v; break;
    default: ((uint8_t *)t->data)[i] = (uint8_t)(me + i); break;
    }
  }
}

static double get(const mk_tensor_t *t, int64_t i) {
  switch (t->dtype) {
  case MK_F32: return ((float *)t->data)[i];
  case MK_F64: return ((double *)t->data)[i];
  case MK_I32: return ((int32_t *)t->data)[i];
  case MK_I64: return (double)((int64_t *)t->data)[i];
  default: return ((uint8_t *)t->data)[i];
  }
}

static double expect(int op, int n, int64_t i, mk_dtype_t dt) {
  double s = 0, mx = -1e300, mn = 1e300;
  for (int r = 0; r < n; r++) {
    double v = value(r, i);
    s += v;
    mx = v > mx ? v : mx;
    mn = v < mn ? v : mn;
  }
  if (op == MN_COLL_MAX) return mx;
  if (op == MN_COLL_MIN) return mn;
  if (op == MN_COLL_AVG) return dt == MK_I32 || dt == MK_I64 ? (double)(int64_t)(s / n) : s / n;
  return s;
}

typedef struct {
  mk_dtype_t dtype;
  int64_t numel;
  int op;
  mk_tensor_t *t[MAXM];
} ar_case_t;

static void body_all_reduce(member_t *m) {
  ar_case_t *k = m->arg;
  if (join(m) != 0) return;
  m->rc = mn_coll_all_reduce(m->c, m->gid, k->t[m->me], k->op, m->err, sizeof(m->err), &m->mismatch);
}

/* all_reduce on n members (host_keys place them): the group must be laid out as `layout`, every element exact. */
static void check_all_reduce_laid_out(int n, mk_dtype_t dt, int64_t numel, int op, int mode, int layout) {
  ar_case_t k = {dt, numel, op, {NULL}};
  member_t m[MAXM];
  char hosts[64] = "";
  for (int i = 0; i < n && host_keys != NULL; i++)
    snprintf(hosts + strlen(hosts), sizeof(hosts) - strlen(hosts), "%s%s", i ? "," : " hosts ", host_keys[i]);
  for (int i = 0; i < n; i++) {
    k.t[i] = tensor_new(dt, numel);
    fill(k.t[i], i);
  }
  run_group(m, n, body_all_reduce, &k, mode);
  for (int i = 0; i < n; i++) {
    if (m[i].rc != 0) fail_msg("member %d%s: %s", i, hosts, m[i].err);
    if (m[i].layout != layout) fail_msg("mode %d%s member %d: layout %d, want %d", mode, hosts, i, m[i].layout, layout);
  }
  for (int64_t e = 0; e < numel; e++) {
    double want = expect(op, n, e, dt), got = get(k.t[0], e);
    if (dt == MK_F32 || dt == MK_F64 ? fabs(got - want) > 1e-9 * fabs(want) : got != want)
      fail_msg("n=%d%s %s op %s element %lld: got %g, want %g", n, hosts, mn_dtype_name(dt), mn_coll_op_name(op),
               (long long)e, got, want);
  }
  for (int i = 1; i < n; i++) assert_memory_equal(k.t[0]->data, k.t[i]->data, k.t[0]->nbytes);
  for (int i = 0; i < n; i++) tensor_free(k.t[i]);
}

/* On one host: shared memory in SHM mode, the links otherwise. */
static void check_all_reduce(int n, mk_dtype_t dt, int64_t numel, int op, int mode) {
  check_all_reduce_laid_out(n, dt, numel, op, mode, mode == SHM ? MN_COLL_ONE_HOST : MN_COLL_FLAT);
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

/* Member 0 is slow to arrive; nobody may leave the barrier before it comes. */
static void body_barrier(member_t *m) {
  if (join(m) != 0) return;
  if (m->me == 0) usleep(200 * 1000);
  double t0 = mn_now_s();
  m->rc = mn_coll_barrier(m->c, m->gid, m->err, sizeof(m->err), &m->mismatch);
  m->seconds = mn_now_s() - t0;
}

static void test_barrier_waits_for_the_last_member(void **state) {
  (void)state;
  member_t m[MAXM];
  for (int mode = CMA; mode <= SHM; mode++) {
    run_group(m, 3, body_barrier, NULL, mode);
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

/* Member 1 leaves (its links close) while member 0 waits in a large all_reduce. */
static void body_peer_leaves(member_t *m) {
  mk_tensor_t *t = tensor_new(MK_F32, 1 << 20);
  if (join(m) == 0) {
    if (m->me == 0) {
      m->rc = mn_coll_all_reduce(m->c, m->gid, t, MN_COLL_SUM, m->err, sizeof(m->err), &m->mismatch);
    } else {
      usleep(100 * 1000);
      m->rc = mn_coll_group_free(m->c, m->gid);
    }
  }
  tensor_free(t);
}

static void test_a_peer_that_leaves_gives_an_error_not_a_hang(void **state) {
  (void)state;
  for (int cma = TCP; cma <= SHM; cma++) {
    member_t m[MAXM];
    run_group(m, 2, body_peer_leaves, NULL, cma);
    assert_int_equal(MN_EPEER, m[0].rc);
    assert_non_null(strstr(m[0].err, "rank 11 (127.0.0.1:"));
    assert_non_null(strstr(m[0].err, "closed its link during all_reduce"));
    assert_true(m[0].seconds < 5);
  }
}

/* Member 1 never calls the collective: member 0 gives up after the timeout, naming it. */
static void body_peer_absent(member_t *m) {
  mk_tensor_t *t = tensor_new(MK_F64, 10);
  if (join(m) == 0 && m->me == 0) {
    mn_coll_set_timeout(m->c, 0.3);
    m->rc = mn_coll_all_reduce(m->c, m->gid, t, MN_COLL_SUM, m->err, sizeof(m->err), &m->mismatch);
    mn_coll_set_timeout(m->c, 20);
  }
  if (m->me == 1) usleep(600 * 1000);
  tensor_free(t);
}

static void test_a_peer_that_never_comes_times_out_by_name(void **state) {
  (void)state;
  member_t m[MAXM];
  for (int mode = CMA; mode <= SHM; mode++) {
    run_group(m, 2, body_peer_absent, NULL, mode);
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
  return cmocka_run_group_tests_name("collective", tests, open_all, close_all);
}
