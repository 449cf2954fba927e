/*
 * fake_gpu.h - a fake CUDA runtime and NCCL on host memory, shared by the
 * unit tests (test_gpu.c, test_gpu_tensors.c install it with
 * mn__gpu_reset()) and by libmonarch_fakegpu.so (fake_gpu.c), which
 * gpu_spec.lua gives to real procs. F is the fake's state; tests set its
 * knobs and read what it recorded.
 */
#ifndef MN_TEST_FAKE_GPU_H
#define MN_TEST_FAKE_GPU_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"

static struct {
  int devices;        /* what GetDeviceCount reports */
  int count_rc;       /* its return code */
  int live;           /* allocations not yet freed */
  int fail_malloc;
  int not_ready;      /* StreamQuery never finishes */
  int hang;           /* the same until a communicator is aborted (a collective whose peer died) */
  int nccl_rc;        /* what collectives return */
  int async_rc;       /* what CommGetAsyncError reports (6, ncclRemoteError: a peer aborted) */
  int comms;          /* live communicators */
  int aborted;
  uint32_t ids;       /* NCCL ids made */
  size_t last_count;  /* arguments of the last collective */
  int last_dtype, last_op, last_root;
  const void *last_send;
  void *last_recv;
} F = {.devices = 1};

static int f_count(int *n) { *n = F.devices; return F.count_rc; }
static int f_set(int d) { return d >= 0 && d < F.devices ? 0 : 101; }
static int f_malloc(void **p, size_t n) {
  if (F.fail_malloc) return 2;
  *p = malloc(n);
  if (*p == NULL) return 2;
  F.live++;
  return 0;
}
static int f_free(void *p) { free(p); F.live--; return 0; }
static int f_memset(void *p, int v, size_t n) { memset(p, v, n); return 0; }
static int f_memcpy(void *d, const void *s, size_t n, int kind) { memcpy(d, s, n); return kind == 1 || kind == 2 ? 0 : 21; }
static int f_sync(void) { return 0; }
static int f_query(void *s) { return F.not_ready || F.hang ? 600 : 0; }
static int f_meminfo(size_t *fb, size_t *tb) { *fb = 1000; *tb = 4000; return 0; }
/* The name tells which GPU a pinned proc was given: "Fake GPU (CUDA_VISIBLE_DEVICES=1)". */
static int f_props(void *p, int dev) {
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  if (vis != NULL && vis[0] != '\0') snprintf(p, 256, "Fake GPU (CUDA_VISIBLE_DEVICES=%.200s)", vis);
  else strcpy(p, "Fake GPU");
  return 0;
}
static int f_attr(int *v, int attr, int dev) { *v = attr == 75 ? 9 : 0; return 0; }
static int f_version(int *v) { *v = 13000; return 0; }
static const char *f_estr(int e) {
  switch (e) {
  case 2: return "out of memory";
  case 100: return "no CUDA-capable device is detected";
  case 600: return "device not ready";
  default: return "fake CUDA error";
  }
}
static int f_last(void) { return 0; }

/* A fake id: "FAKE", the maker's pid and count, then every byte value, so a
 * copy that is not binary-safe is caught by n_init. */
typedef struct {
  int nranks, rank;
  uint32_t pid, serial;
} fake_comm_t;

static int n_version(int *v) { *v = 22809; return 0; }
static int n_id(mn_nccl_id_t *id) {
  uint32_t pid = (uint32_t)getpid(), serial = ++F.ids;
  memcpy(id->internal, "FAKE", 4);
  memcpy(id->internal + 4, &pid, 4);
  memcpy(id->internal + 8, &serial, 4);
  for (int i = 12; i < MN_GPU_NCCL_ID_BYTES; i++) id->internal[i] = (char)(i * 37 + 11);
  return 0;
}
static int n_init(void **c, int nranks, mn_nccl_id_t id, int rank) {
  if (memcmp(id.internal, "FAKE", 4) != 0) return 4;
  for (int i = 12; i < MN_GPU_NCCL_ID_BYTES; i++)
    if (id.internal[i] != (char)(i * 37 + 11)) return 4;
  fake_comm_t *fc = malloc(sizeof(*fc));
  if (fc == NULL) return 1;
  fc->nranks = nranks, fc->rank = rank;
  memcpy(&fc->pid, id.internal + 4, 4);
  memcpy(&fc->serial, id.internal + 8, 4);
  *c = fc;
  F.comms++;
  return 0;
}
static int n_destroy(void *c) { free(c); F.comms--; return 0; }
static int n_abort(void *c) {
  F.aborted++;
  F.hang = 0;
  return n_destroy(c);
}
static int n_async(void *c, int *e) { *e = F.async_rc; return 0; }
static int record(const void *s, void *r, size_t count, int dt, int op, int root) {
  F.last_send = s, F.last_recv = r, F.last_count = count, F.last_dtype = dt, F.last_op = op, F.last_root = root;
  return F.nccl_rc;
}
static int n_all_reduce(const void *s, void *r, size_t count, int dt, int op, void *c, void *st) {
  return record(s, r, count, dt, op, -1);
}
static int n_broadcast(const void *s, void *r, size_t count, int dt, int root, void *c, void *st) {
  return record(s, r, count, dt, -1, root);
}
static int n_all_gather(const void *s, void *r, size_t count, int dt, void *c, void *st) {
  return record(s, r, count, dt, -1, -1);
}
static int n_reduce_scatter(const void *s, void *r, size_t count, int dt, int op, void *c, void *st) {
  return record(s, r, count, dt, op, -1);
}
static const char *n_estr(int rc) {
  return rc == 5 ? "invalid usage" : rc == 6 ? "remote process exited or there was a network error" : "fake NCCL error";
}
static const char *n_last(void *c) { return F.nccl_rc ? "Duplicate GPU detected" : ""; }

#endif
