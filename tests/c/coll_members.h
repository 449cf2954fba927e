/*
 * coll_members.h - what test_collective.c and test_coll_failures.c share:
 * MAXM mn_coll_t instances in this one process (open_all/close_all, the
 * group setup and teardown), a group of them run as one thread per member
 * over real loopback sockets (run_group: TCP only, direct copies, or shared
 * memory), tensors whose values each member can predict, and
 * check_all_reduce, the all_reduce every test can end with.
 */
#ifndef MN_TEST_COLL_MEMBERS_H
#define MN_TEST_COLL_MEMBERS_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
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

static inline int open_all(void **state) {
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

static inline int close_all(void **state) {
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

static inline void run_group(member_t *m, int n, body_fn body, void *arg, int mode) {
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

static inline int join(member_t *m) {
  const char *addrs[MAXM];
  int ranks[MAXM];
  for (int i = 0; i < m->n; i++) addrs[i] = addr[i], ranks[i] = 10 + i;
  m->rc = mn_coll_group(m->c, m->gid, m->me, m->n, addrs, ranks, m->err, sizeof(m->err));
  m->layout = mn_coll_group_layout(m->c, m->gid);
  return m->rc;
}

static inline mk_tensor_t *tensor_new(mk_dtype_t dt, int64_t numel) {
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

static inline void tensor_free(mk_tensor_t *t) {
  free(t->data);
  free(t);
}

/* Rank-dependent values whose sums are exact in every dtype. */
static inline double value(int me, int64_t i) { return (double)((me + 1) * ((i % 1000) - 300)); }

static inline void fill(mk_tensor_t *t, int me) {
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

static inline double get(const mk_tensor_t *t, int64_t i) {
  switch (t->dtype) {
  case MK_F32: return ((float *)t->data)[i];
  case MK_F64: return ((double *)t->data)[i];
  case MK_I32: return ((int32_t *)t->data)[i];
  case MK_I64: return (double)((int64_t *)t->data)[i];
  default: return ((uint8_t *)t->data)[i];
  }
}

static inline double expect(int op, int n, int64_t i, mk_dtype_t dt) {
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

static inline void body_all_reduce(member_t *m) {
  ar_case_t *k = m->arg;
  if (join(m) != 0) return;
  m->rc = mn_coll_all_reduce(m->c, m->gid, k->t[m->me], k->op, m->err, sizeof(m->err), &m->mismatch);
}

/* all_reduce on n members (host_keys place them): the group must be laid out as `layout`, every element exact. */
static inline void check_all_reduce_laid_out(int n, mk_dtype_t dt, int64_t numel, int op, int mode, int layout) {
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
static inline void check_all_reduce(int n, mk_dtype_t dt, int64_t numel, int op, int mode) {
  check_all_reduce_laid_out(n, dt, numel, op, mode, mode == SHM ? MN_COLL_ONE_HOST : MN_COLL_FLAT);
}


#endif
