/*
 * test_gpu.c - unit tests for host/worker/gpu.c, the proc's GPU built-ins,
 * on machines with or without CUDA.
 *
 * Three layers: the real loader with a bogus library name (the "not found"
 * path every CPU-only host takes), the real loader as this host has it (a
 * clear error or a real device, never a crash), and a fake CUDA runtime and
 * NCCL (host memory standing in for device memory) installed with
 * mn__gpu_reset(), which drives every built-in's logic and error path
 * without a GPU. Calls go through mn_exec_frame() exactly as a proc runs
 * them.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"

/* ---- a fake CUDA runtime and NCCL ------------------------------------------- */

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

#ifdef MN_GPU_FAKE_LIB
/*
 * Built as build/tests/libmonarch_fakegpu.so (mk/cuda.mk) for gpu_spec.lua:
 * a proc given MONARCH_CUDART and MONARCH_NCCL naming this file runs every
 * GPU built-in on host memory. Each process is its own fake device, so a
 * collective cannot combine data across procs; instead an f32 all_reduce of
 * 4 or more elements writes what its communicator is into the tensor:
 * {nranks, rank, pid of the proc that made the id, that id's serial}. One of
 * exactly 13 elements fails with ncclInvalidUsage; one of exactly 17 never
 * completes (as when a peer died) until its communicator is aborted.
 */
#define EXPORT __attribute__((visibility("default")))
EXPORT int cudaGetDeviceCount(int *n) { return f_count(n); }
EXPORT int cudaSetDevice(int d) { return f_set(d); }
EXPORT int cudaMalloc(void **p, size_t n) { return f_malloc(p, n); }
EXPORT int cudaFree(void *p) { return f_free(p); }
EXPORT int cudaMemset(void *p, int v, size_t n) { return f_memset(p, v, n); }
EXPORT int cudaMemcpy(void *d, const void *s, size_t n, int kind) { return f_memcpy(d, s, n, kind); }
EXPORT int cudaDeviceSynchronize(void) { return f_sync(); }
EXPORT int cudaStreamQuery(void *s) { return f_query(s); }
EXPORT int cudaMemGetInfo(size_t *fb, size_t *tb) { return f_meminfo(fb, tb); }
EXPORT int cudaGetDeviceProperties(void *p, int dev) { return f_props(p, dev); }
EXPORT int cudaDeviceGetAttribute(int *v, int attr, int dev) { return f_attr(v, attr, dev); }
EXPORT int cudaRuntimeGetVersion(int *v) { return f_version(v); }
EXPORT int cudaDriverGetVersion(int *v) { return f_version(v); }
EXPORT const char *cudaGetErrorString(int e) { return f_estr(e); }
EXPORT int cudaGetLastError(void) { return f_last(); }
EXPORT int ncclGetVersion(int *v) { return n_version(v); }
EXPORT int ncclGetUniqueId(mn_nccl_id_t *id) { return n_id(id); }
EXPORT int ncclCommInitRank(void **c, int nranks, mn_nccl_id_t id, int rank) { return n_init(c, nranks, id, rank); }
EXPORT int ncclCommDestroy(void *c) { return n_destroy(c); }
EXPORT int ncclCommAbort(void *c) { return n_abort(c); }
EXPORT int ncclCommGetAsyncError(void *c, int *e) { return n_async(c, e); }
EXPORT int ncclAllReduce(const void *s, void *r, size_t count, int dt, int op, void *c, void *st) {
  const fake_comm_t *fc = c;
  if (count == 13) return 5;
  if (count == 17) F.hang = 1;
  if (dt == 7 && count >= 4) {
    float *out = r;
    out[0] = (float)fc->nranks, out[1] = (float)fc->rank, out[2] = (float)fc->pid, out[3] = (float)fc->serial;
  }
  return n_all_reduce(s, r, count, dt, op, c, st);
}
EXPORT int ncclBroadcast(const void *s, void *r, size_t count, int dt, int root, void *c, void *st) {
  return n_broadcast(s, r, count, dt, root, c, st);
}
EXPORT int ncclAllGather(const void *s, void *r, size_t count, int dt, void *c, void *st) {
  return n_all_gather(s, r, count, dt, c, st);
}
EXPORT int ncclReduceScatter(const void *s, void *r, size_t count, int dt, int op, void *c, void *st) {
  return n_reduce_scatter(s, r, count, dt, op, c, st);
}
EXPORT const char *ncclGetErrorString(int rc) { return n_estr(rc); }
EXPORT const char *ncclGetLastError(void *c) { return n_last(c); }
#else

#include <stdarg.h>
#include <setjmp.h>
#include <cmocka.h>

#include "clock.h"
#include "exec.h"
#include "registry.h"
#include "wire.h"

#define BOGUS_CUDART "libmonarch-no-such-cudart.so"
#define BOGUS_NCCL "libmonarch-no-such-nccl.so"

static const mn_cudart_t fake_rt = {f_count, f_set, f_malloc, f_free, f_memset, f_memcpy, f_sync, f_query,
                                    f_meminfo, f_props, f_attr, f_version, f_version, f_estr, f_last};

static const mn_nccl_t fake_nccl = {n_version, n_id, n_init, n_destroy, n_abort, n_async, n_all_reduce,
                                    n_broadcast, n_all_gather, n_reduce_scatter, n_estr, n_last};

/* ---- fixture and calls -------------------------------------------------------- */

typedef struct {
  mn_exec_t x;
  atomic_int cancel;
  uint64_t seq;
} fix_t;

static int setup_with(void **state, const mn_cudart_t *rt, const mn_nccl_t *nccl) {
  fix_t *f = calloc(1, sizeof(*f));
  if (f == NULL) return -1;
  atomic_init(&f->cancel, 0);
  if (mn_exec_init(&f->x, "build", 0, 1, &f->cancel) != 0) return -1;
  memset(&F, 0, sizeof(F));
  F.devices = 2;
  unsetenv("MONARCH_CUDART");
  unsetenv("MONARCH_NCCL");
  unsetenv("MONARCH_GPU_TIMEOUT");
  mn__gpu_reset(rt, nccl);
  *state = f;
  return 0;
}
static int setup_real(void **state) { return setup_with(state, NULL, NULL); }
static int setup_fake(void **state) { return setup_with(state, &fake_rt, &fake_nccl); }
static int setup_fake_runtime(void **state) { return setup_with(state, &fake_rt, NULL); }

static int teardown(void **state) {
  fix_t *f = *state;
  mn_exec_close(&f->x);
  mn__gpu_reset(NULL, NULL);
  free(f);
  return 0;
}

typedef struct {
  mn_buf_t b;
  msgpack_packer pk;
  size_t start;
  uint64_t seq;
} call_t;

static msgpack_packer *begin(fix_t *f, call_t *c, const char *name, uint32_t nargs) {
  mn_buf_init(&c->b);
  msgpack_packer_init(&c->pk, &c->b, mn_buf_write_cb);
  c->start = mn_frame_begin(&c->b);
  c->seq = ++f->seq;
  msgpack_pack_array(&c->pk, 4);
  msgpack_pack_int(&c->pk, MN_MSG_CALL);
  msgpack_pack_uint64(&c->pk, c->seq);
  mn_pack_cstr(&c->pk, name);
  msgpack_pack_array(&c->pk, nargs);
  return &c->pk;
}

static void pack_tensor(msgpack_packer *pk, uint64_t id) {
  char be[8];
  for (int i = 0; i < 8; i++) be[i] = (char)(id >> (56 - 8 * i));
  msgpack_pack_ext(pk, 8, 1);
  msgpack_pack_ext_body(pk, be, 8);
}

typedef struct {
  char *body;
  msgpack_zone zone;
  msgpack_object obj;
  int ok;
  char kind[64];
  char msg[MN_MAX_ERRMSG + 1];
  const msgpack_object *values;
} reply_t;

/* Runs the call and decodes its one RESULT frame. */
static void run(fix_t *f, call_t *c, reply_t *r) {
  const char *body;
  char err[256];
  mn_frame_end(&c->b, c->start);
  int64_t n = mn_frame_peek(c->b.data, c->b.len, MN_MAX_FRAME, &body);
  assert_true(n > 0);
  assert_int_equal(mn_exec_frame(&f->x, body, (size_t)n), 0);
  mn_buf_free(&c->b);
  n = mn_frame_peek(f->x.out.data, f->x.out.len, MN_MAX_FRAME, &body);
  assert_true(n > 0);
  r->body = malloc((size_t)n);
  assert_non_null(r->body);
  memcpy(r->body, body, (size_t)n);
  mn_buf_consume(&f->x.out, f->x.out.len);
  assert_true(msgpack_zone_init(&r->zone, 4096));
  assert_int_equal(mn_decode(r->body, (size_t)n, &r->zone, &r->obj, err, sizeof(err)), 0);
  assert_int_equal(mn_msg_type(&r->obj), MN_MSG_RESULT);
  r->ok = r->obj.via.array.ptr[2].via.boolean;
  r->kind[0] = r->msg[0] = '\0';
  r->values = NULL;
  if (r->ok) {
    r->values = &r->obj.via.array.ptr[3];
  } else {
    const msgpack_object *k = mn_map_get(&r->obj.via.array.ptr[3], "kind");
    const msgpack_object *m = mn_map_get(&r->obj.via.array.ptr[3], "message");
    assert_non_null(k);
    assert_non_null(m);
    snprintf(r->kind, sizeof(r->kind), "%.*s", (int)k->via.str.size, k->via.str.ptr);
    snprintf(r->msg, sizeof(r->msg), "%.*s", (int)m->via.str.size, m->via.str.ptr);
  }
}

static void done(reply_t *r) {
  msgpack_zone_destroy(&r->zone);
  free(r->body);
}

static void expect_ok(reply_t *r) {
  if (!r->ok) print_error("call failed: %s: %s\n", r->kind, r->msg);
  assert_true(r->ok);
}

static void expect_fail(reply_t *r, const char *kind, const char *needle) {
  if (r->ok || strcmp(r->kind, kind) != 0 || strstr(r->msg, needle) == NULL)
    print_error("wanted a %s error with \"%s\"; got ok=%d kind \"%s\" message \"%s\"\n", kind, needle, r->ok,
                r->kind, r->msg);
  assert_false(r->ok);
  assert_string_equal(r->kind, kind);
  assert_non_null(strstr(r->msg, needle));
}

/* Shorthands: each runs one call and leaves its reply in r. */
static void call0(fix_t *f, const char *name, reply_t *r) {
  call_t c;
  begin(f, &c, name, 0);
  run(f, &c, r);
}

static void call_t1(fix_t *f, const char *name, uint64_t t, reply_t *r) {
  call_t c;
  pack_tensor(begin(f, &c, name, 1), t);
  run(f, &c, r);
}

static void tensor_new(fix_t *f, uint64_t id, const char *dtype, int64_t n, reply_t *r) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, "__gpu_tensor_new", 3);
  msgpack_pack_uint64(pk, id);
  mn_pack_cstr(pk, dtype);
  msgpack_pack_array(pk, 1);
  msgpack_pack_int64(pk, n);
  run(f, &c, r);
}

/* ---- the real loader ------------------------------------------------------------ */

static void test_bogus_runtime_is_a_clear_error(void **state) {
  fix_t *f = *state;
  reply_t r;
  setenv("MONARCH_CUDART", BOGUS_CUDART, 1);
  for (int i = 0; i < 2; i++) { /* the reason is kept, and given again */
    call0(f, "__gpu_info", &r);
    expect_fail(&r, "no_gpu", "no CUDA runtime on this host: " BOGUS_CUDART " not found (MONARCH_CUDART)");
    done(&r);
  }
  tensor_new(f, 1, "f32", 4, &r);
  expect_fail(&r, "no_gpu", "no CUDA runtime on this host");
  done(&r);
  call0(f, "__gpu_nccl_id", &r);
  expect_fail(&r, "no_gpu", "no CUDA runtime on this host");
  done(&r);
  call0(f, "__gpu_sync", &r);
  expect_fail(&r, "no_gpu", "no CUDA runtime on this host");
  done(&r);
}

/* Whatever this host has: a device, or one of the two clear reasons. */
static void test_real_runtime_answers_or_explains(void **state) {
  fix_t *f = *state;
  reply_t r;
  call0(f, "__gpu_info", &r);
  if (r.ok) {
    assert_true(r.values->via.array.size == 8);
    assert_true(r.values->via.array.ptr[0].via.u64 >= 1);
    printf("    this host has a GPU: %.*s\n", (int)r.values->via.array.ptr[1].via.str.size,
           r.values->via.array.ptr[1].via.str.ptr);
  } else {
    assert_string_equal(r.kind, "no_gpu");
    assert_true(strstr(r.msg, "no CUDA runtime on this host") == r.msg || strstr(r.msg, "no CUDA device") == r.msg);
    printf("    no GPU here: %s\n", r.msg);
  }
  done(&r);
}

static void test_bogus_nccl_is_a_clear_error(void **state) {
  fix_t *f = *state;
  reply_t r;
  setenv("MONARCH_NCCL", BOGUS_NCCL, 1);
  call0(f, "__gpu_nccl_id", &r);
  expect_fail(&r, "no_gpu", "NCCL is not available on this host: " BOGUS_NCCL " not found (MONARCH_NCCL)");
  done(&r);
  call_t c;
  msgpack_packer *pk = begin(f, &c, "__gpu_all_reduce", 3);
  msgpack_pack_int(pk, 1);
  pack_tensor(pk, 1);
  mn_pack_cstr(pk, "sum");
  run(f, &c, &r);
  expect_fail(&r, "no_gpu", "NCCL is not available");
  done(&r);
}

/* mn_gpu_pin picks one entry of what the process may see. */
static void test_pin_narrows_the_visible_devices(void **state) {
  char err[256];
  unsetenv("CUDA_VISIBLE_DEVICES");
  assert_int_equal(mn_gpu_pin(3, err, sizeof(err)), 0);
  assert_string_equal(getenv("CUDA_VISIBLE_DEVICES"), "3");
  setenv("CUDA_VISIBLE_DEVICES", "4,GPU-5b2e,6", 1);
  assert_int_equal(mn_gpu_pin(1, err, sizeof(err)), 0);
  assert_string_equal(getenv("CUDA_VISIBLE_DEVICES"), "GPU-5b2e");
  setenv("CUDA_VISIBLE_DEVICES", "4,6", 1);
  assert_int_equal(mn_gpu_pin(2, err, sizeof(err)), MN_EINVAL);
  assert_string_equal(err, "cannot pin to GPU 2: CUDA_VISIBLE_DEVICES=4,6 lists fewer devices");
  assert_int_equal(mn_gpu_pin(-1, err, sizeof(err)), MN_EINVAL);
  assert_string_equal(getenv("CUDA_VISIBLE_DEVICES"), "4,6");
  unsetenv("CUDA_VISIBLE_DEVICES");
}

/* ---- the fake runtime -------------------------------------------------------------- */

static void test_info_describes_the_device(void **state) {
  fix_t *f = *state;
  reply_t r;
  call0(f, "__gpu_info", &r);
  expect_ok(&r);
  const msgpack_object *v = r.values;
  assert_int_equal(v->via.array.size, 8);
  assert_int_equal(v->via.array.ptr[0].via.u64, 2);
  assert_int_equal(v->via.array.ptr[1].via.str.size, strlen("Fake GPU"));
  assert_memory_equal(v->via.array.ptr[1].via.str.ptr, "Fake GPU", strlen("Fake GPU"));
  assert_int_equal(v->via.array.ptr[2].via.u64, 4000);
  assert_int_equal(v->via.array.ptr[3].via.u64, 1000);
  assert_memory_equal(v->via.array.ptr[4].via.str.ptr, "9.0", 3);
  assert_int_equal(v->via.array.ptr[7].via.u64, 0);
  done(&r);
}

static void test_no_device_is_a_clear_error(void **state) {
  fix_t *f = *state;
  reply_t r;
  F.count_rc = 100;
  call0(f, "__gpu_info", &r);
  expect_fail(&r, "no_gpu", "no CUDA device: cudaGetDeviceCount failed: no CUDA-capable device is detected");
  done(&r);
  mn__gpu_reset(&fake_rt, &fake_nccl);
  F.count_rc = 0;
  F.devices = 0;
  call0(f, "__gpu_info", &r);
  expect_fail(&r, "no_gpu", "no CUDA device: the CUDA runtime sees 0 devices");
  done(&r);
}

static void test_bad_arguments_are_named(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  tensor_new(f, 1, "f33", 4, &r);
  expect_fail(&r, "bad_args", "unknown dtype 'f33'");
  done(&r);
  call0(f, "__gpu_tensor_new", &r);
  expect_fail(&r, "bad_args", "__gpu_tensor_new takes (id, dtype, shape, device?)");
  done(&r);
  msgpack_packer *pk = begin(f, &c, "__gpu_tensor_new", 4);
  msgpack_pack_int(pk, 1);
  mn_pack_cstr(pk, "f32");
  msgpack_pack_array(pk, 0);
  msgpack_pack_int(pk, 5);
  run(f, &c, &r);
  expect_fail(&r, "bad_args", "device 5 does not exist: this proc sees 2 CUDA devices (0..1)");
  done(&r);
  call0(f, "__gpu_fetch", &r);
  expect_fail(&r, "bad_args", "__gpu_fetch: argument 1 must be a tensor");
  done(&r);
  call_t1(f, "__gpu_fetch", 99, &r);
  expect_fail(&r, "bad_args", "tensor 99 does not exist on this proc");
  done(&r);
  call0(f, "__gpu_free", &r);
  expect_fail(&r, "bad_args", "__gpu_free takes a tensor");
  done(&r);
  call_t1(f, "__gpu_free", 99, &r);
  expect_ok(&r);
  assert_false(r.values->via.array.ptr[0].via.boolean);
  done(&r);
  call0(f, "__gpu_nope", &r);
  expect_fail(&r, "bad_args", "unknown GPU built-in '__gpu_nope'");
  done(&r);
}

static void test_cpu_tensors_are_refused(void **state) {
  fix_t *f = *state;
  reply_t r;
  int64_t shape[1] = {4};
  char err[128];
  assert_non_null(mn_tensor_new(&f->x.reg, 5, MK_F32, 1, shape, err, sizeof(err)));
  call_t1(f, "__gpu_fetch", 5, &r);
  expect_fail(&r, "bad_args", "__gpu_fetch: tensor 5 is on the CPU");
  done(&r);
  call_t1(f, "__gpu_free", 5, &r);
  expect_fail(&r, "bad_args", "tensor 5 is on the CPU (free it with __tensor_free)");
  done(&r);
}

#ifdef MN_DEVICE_HOOKS
static void pack_bin(msgpack_packer *pk, const void *p, size_t n) {
  msgpack_pack_bin(pk, n);
  msgpack_pack_bin_body(pk, p, n);
}

/* Checks a call succeeded and releases its reply. */
static void expect_done(reply_t *r) {
  expect_ok(r);
  done(r);
}

static void test_tensors_live_in_device_memory(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  float in[4] = {1, 2, 3, 4};
  tensor_new(f, 7, "f32", 4, &r);
  expect_done(&r);
  assert_int_equal(F.live, 1);
  mk_tensor_t *t = mn_tensor_get(&f->x.reg, 7);
  assert_non_null(t);
  assert_int_equal(t->device, 0);
  assert_int_equal(t->nbytes, 16);
  call_t1(f, "__gpu_fetch", 7, &r); /* zeroed */
  expect_ok(&r);
  assert_int_equal(r.values->via.array.ptr[0].via.bin.size, 16);
  assert_memory_equal(r.values->via.array.ptr[0].via.bin.ptr, (float[4]){0}, 16);
  done(&r);
  msgpack_packer *pk = begin(f, &c, "__gpu_put", 2);
  pack_tensor(pk, 7);
  pack_bin(pk, in, sizeof(in));
  run(f, &c, &r);
  expect_done(&r);
  call_t1(f, "__gpu_fetch", 7, &r);
  expect_ok(&r);
  assert_memory_equal(r.values->via.array.ptr[0].via.bin.ptr, in, 16);
  done(&r);
  pk = begin(f, &c, "__gpu_put", 2);
  pack_tensor(pk, 7);
  pack_bin(pk, in, 8);
  run(f, &c, &r);
  expect_fail(&r, "bad_args", "__gpu_put: 8 bytes into a tensor of 16 bytes");
  done(&r);
  /* The CPU path refuses device memory instead of reading it. */
  call_t1(f, "__tensor_fetch", 7, &r);
  expect_fail(&r, "bad_args", "is on cuda:0");
  done(&r);
  tensor_new(f, 7, "f32", 4, &r);
  expect_fail(&r, "bad_args", "tensor 7 already exists");
  done(&r);
  call_t1(f, "__gpu_free", 7, &r);
  expect_ok(&r);
  assert_true(r.values->via.array.ptr[0].via.boolean);
  done(&r);
  assert_int_equal(F.live, 0);
  /* __tensor_free and closing the registry release device memory through the hooks too. */
  tensor_new(f, 8, "u8", 3, &r);
  expect_done(&r);
  tensor_new(f, 9, "f64", 0, &r);
  expect_done(&r);
  assert_int_equal(F.live, 2);
  call_t1(f, "__tensor_free", 8, &r);
  expect_done(&r);
  assert_int_equal(F.live, 1);
  mn_registry_close(&f->x.reg);
  assert_int_equal(F.live, 0);
}

static void test_allocation_failure_is_a_gpu_error(void **state) {
  fix_t *f = *state;
  reply_t r;
  F.fail_malloc = 1;
  tensor_new(f, 3, "f32", 1 << 20, &r);
  expect_fail(&r, "gpu", "cudaMalloc of 4194304 bytes on cuda:0 failed: out of memory");
  done(&r);
  assert_null(mn_tensor_get(&f->x.reg, 3));
  tensor_new(f, 3, "f32", -1, &r);
  expect_fail(&r, "bad_args", "invalid size -1");
  done(&r);
}

/* Makes communicator `comm` of nranks, as member `rank`; returns nothing. */
static void comm_init_n(fix_t *f, uint64_t comm, int nranks, int rank) {
  reply_t r;
  call_t c;
  call0(f, "__gpu_nccl_id", &r);
  expect_ok(&r);
  assert_int_equal(r.values->via.array.ptr[0].via.bin.size, MN_GPU_NCCL_ID_BYTES);
  char id[MN_GPU_NCCL_ID_BYTES];
  memcpy(id, r.values->via.array.ptr[0].via.bin.ptr, sizeof(id));
  done(&r);
  msgpack_packer *pk = begin(f, &c, "__gpu_nccl_init", 4);
  msgpack_pack_uint64(pk, comm);
  pack_bin(pk, id, sizeof(id));
  msgpack_pack_int(pk, nranks);
  msgpack_pack_int(pk, rank);
  run(f, &c, &r);
  expect_done(&r);
}

static void comm_init(fix_t *f, uint64_t comm) { comm_init_n(f, comm, 1, 0); }

static void coll(fix_t *f, const char *name, uint64_t comm, uint64_t a, uint64_t b, const char *op, reply_t *r) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, name, 2 + (b != 0) + (op != NULL));
  msgpack_pack_uint64(pk, comm);
  pack_tensor(pk, a);
  if (b) pack_tensor(pk, b);
  if (op) mn_pack_cstr(pk, op);
  run(f, &c, r);
}

static void test_collectives_reach_nccl(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  int64_t shape[1] = {6};
  char err[128];
  comm_init(f, 41);
  assert_int_equal(F.comms, 1);
  tensor_new(f, 1, "f32", 6, &r);
  expect_done(&r);
  tensor_new(f, 2, "f32", 6, &r);
  expect_done(&r);
  mk_tensor_t *t1 = mn_tensor_get(&f->x.reg, 1), *t2 = mn_tensor_get(&f->x.reg, 2);

  coll(f, "__gpu_all_reduce", 41, 1, 0, "max", &r);
  expect_done(&r);
  assert_int_equal(F.last_count, 6);
  assert_int_equal(F.last_dtype, 7);
  assert_int_equal(F.last_op, 2);
  assert_ptr_equal(F.last_send, t1->data);
  assert_ptr_equal(F.last_recv, t1->data);
  coll(f, "__gpu_all_reduce", 41, 1, 0, "prod", &r);
  expect_fail(&r, "bad_args", "argument 3 must be a reduction: \"sum\", \"max\", \"min\" or \"avg\"");
  done(&r);
  coll(f, "__gpu_all_reduce", 42, 1, 0, "sum", &r);
  expect_fail(&r, "bad_args", "communicator 42 does not exist on this proc");
  done(&r);
  assert_non_null(mn_tensor_new(&f->x.reg, 3, MK_F32, 1, shape, err, sizeof(err)));
  coll(f, "__gpu_all_reduce", 41, 3, 0, "sum", &r);
  expect_fail(&r, "bad_args", "tensor 3 is on the CPU");
  done(&r);

  call_t *bc = &c;
  msgpack_packer *pk = begin(f, bc, "__gpu_broadcast", 3);
  msgpack_pack_uint64(pk, 41);
  pack_tensor(pk, 2);
  msgpack_pack_int(pk, 0);
  run(f, bc, &r);
  expect_done(&r);
  assert_int_equal(F.last_root, 0);
  pk = begin(f, bc, "__gpu_broadcast", 3);
  msgpack_pack_uint64(pk, 41);
  pack_tensor(pk, 2);
  msgpack_pack_int(pk, 1);
  run(f, bc, &r);
  expect_fail(&r, "bad_args", "argument 3 must be the root rank, 0..0");
  done(&r);

  /* One rank: gather and scatter sides have the same size, but must be separate tensors. */
  coll(f, "__gpu_all_gather", 41, 1, 2, NULL, &r);
  expect_done(&r);
  assert_ptr_equal(F.last_send, t1->data);
  assert_ptr_equal(F.last_recv, t2->data);
  coll(f, "__gpu_all_gather", 41, 1, 1, NULL, &r);
  expect_fail(&r, "bad_args", "recv must be a separate f32 tensor of 1 x 6 elements");
  done(&r);
  tensor_new(f, 4, "f32", 5, &r);
  expect_done(&r);
  coll(f, "__gpu_reduce_scatter", 41, 4, 1, "sum", &r);
  expect_fail(&r, "bad_args", "send must be a separate f32 tensor of 1 x 6 elements (1 ranks), got f32 of 5");
  done(&r);
  coll(f, "__gpu_reduce_scatter", 41, 2, 1, "avg", &r);
  expect_done(&r);
  assert_int_equal(F.last_op, 4);

  /* NCCL's own failure comes back with its message and last error. */
  F.nccl_rc = 5;
  coll(f, "__gpu_all_reduce", 41, 1, 0, "sum", &r);
  expect_fail(&r, "gpu", "__gpu_all_reduce failed: invalid usage (Duplicate GPU detected)");
  done(&r);
  F.nccl_rc = 0;

  call_t1(f, "__gpu_nccl_free", 41, &r); /* an id, not a tensor: refused */
  expect_fail(&r, "bad_args", "__gpu_nccl_free takes a communicator id");
  done(&r);
  pk = begin(f, &c, "__gpu_nccl_free", 1);
  msgpack_pack_uint64(pk, 41);
  run(f, &c, &r);
  expect_ok(&r);
  assert_true(r.values->via.array.ptr[0].via.boolean);
  done(&r);
  assert_int_equal(F.comms, 0);
}

static void test_nccl_init_checks_its_arguments(void **state) {
  fix_t *f = *state;
  reply_t r;
  call_t c;
  char id[MN_GPU_NCCL_ID_BYTES];
  memset(id, 0xab, sizeof(id));
  msgpack_packer *pk = begin(f, &c, "__gpu_nccl_init", 4);
  msgpack_pack_uint64(pk, 1);
  pack_bin(pk, id, 5);
  msgpack_pack_int(pk, 2);
  msgpack_pack_int(pk, 0);
  run(f, &c, &r);
  expect_fail(&r, "bad_args", "the NCCL id must be 128 bytes, got 5");
  done(&r);
  pk = begin(f, &c, "__gpu_nccl_init", 4);
  msgpack_pack_uint64(pk, 1);
  pack_bin(pk, id, sizeof(id));
  msgpack_pack_int(pk, 2);
  msgpack_pack_int(pk, 2);
  run(f, &c, &r);
  expect_fail(&r, "bad_args", "rank 2 is outside 0..nranks-1 (nranks 2)");
  done(&r);
  comm_init(f, 1);
  comm_init(f, 2);
  pk = begin(f, &c, "__gpu_nccl_init", 4);
  msgpack_pack_uint64(pk, 1);
  pack_bin(pk, id, sizeof(id));
  msgpack_pack_int(pk, 1);
  msgpack_pack_int(pk, 0);
  run(f, &c, &r);
  expect_fail(&r, "bad_args", "communicator 1 already exists");
  done(&r);
  id[0] = 0; /* the fake refuses ids it did not make */
  pk = begin(f, &c, "__gpu_nccl_init", 4);
  msgpack_pack_uint64(pk, 3);
  pack_bin(pk, id, sizeof(id));
  msgpack_pack_int(pk, 1);
  msgpack_pack_int(pk, 0);
  run(f, &c, &r);
  expect_fail(&r, "gpu", "ncclCommInitRank failed");
  done(&r);
  assert_int_equal(F.comms, 2);
}

/* A collective whose peers never come is aborted, not waited on forever. */
static void test_stuck_collective_aborts_its_communicator(void **state) {
  fix_t *f = *state;
  reply_t r;
  comm_init(f, 5);
  tensor_new(f, 1, "i64", 3, &r);
  expect_done(&r);
  setenv("MONARCH_GPU_TIMEOUT", "0.05", 1);
  F.not_ready = 1;
  coll(f, "__gpu_all_reduce", 5, 1, 0, "sum", &r);
  expect_fail(&r, "gpu", "__gpu_all_reduce on communicator 5 timed out after 0 s (did every rank join?); communicator aborted");
  done(&r);
  assert_int_equal(F.aborted, 1);
  assert_int_equal(F.last_dtype, 4);
  coll(f, "__gpu_all_reduce", 5, 1, 0, "sum", &r);
  expect_fail(&r, "bad_args", "communicator 5 does not exist");
  done(&r);
  comm_init(f, 6);
  atomic_store(&f->cancel, 1);
  coll(f, "__gpu_all_reduce", 6, 1, 0, "min", &r);
  expect_fail(&r, "cancelled", "on communicator 6 cancelled");
  done(&r);
  assert_int_equal(F.aborted, 2);
  assert_int_equal(F.comms, 0);
}

/* ---- collectives kernels call, on GPU tensors ------------------------------------------
 * The kcoll library's kernels (kc_all_reduce ...) on a group of two whose
 * CPU half is a fake (exec.h's mn_exec_coll_t): it records what the
 * executor asks of it and plays member 1, who describes the same call as
 * member 0 (this proc) or, with peer_differs, a broadcast instead. */
static struct {
  int calls[MN_KCOLL_FENCE + 1];
  int aborted;
  int peer_differs;
} C;

static int fc_group(mn_exec_t *x, uint64_t gid, mk_group_t *g, char *err, size_t errlen) {
  g->id = gid, g->rank = 0, g->size = 2;
  return 0;
}
static int fc_run(mn_exec_t *x, const mn_kcoll_t *k, char *err, size_t errlen, int *mismatch) {
  C.calls[k->what]++;
  if (k->what == MN_KCOLL_ALL_GATHER) { /* the members' descriptions of a GPU collective */
    memcpy(k->dst->data, k->t->data, k->t->nbytes);
    memcpy((char *)k->dst->data + k->t->nbytes, k->t->data, k->t->nbytes);
    int64_t *peer = (int64_t *)((char *)k->dst->data + k->t->nbytes);
    peer[0] = 1;
    if (C.peer_differs) peer[1] = MN_KCOLL_BROADCAST, peer[2] = 1;
  }
  return 0;
}
static void fc_abort(mn_exec_t *x, uint64_t gid, const char *why) { C.aborted++; }
static const mn_exec_coll_t fake_coll = {fc_group, fc_run, fc_abort};

/* A fixture with the fake group, kcoll loaded, GPU group 77 (a communicator of two ranks), and GPU tensors 1
 * (f32 x 6), 2 (f32 x 12) and CPU tensor 3 (f32 x 6). */
static int setup_kcoll(void **state) {
  if (setup_fake(state) != 0) return -1;
  fix_t *f = *state;
  reply_t r;
  call_t c;
  char path[1024], err[128];
  int64_t shape[1] = {6};
  const char *dir = getenv("MONARCH_KERNEL_DIR");
  snprintf(path, sizeof(path), "%s/kcoll.so", dir ? dir : "build/lib/monarch");
  memset(&C, 0, sizeof(C));
  mn_exec_set_coll(&fake_coll);
  mn_pack_cstr(begin(f, &c, "__load", 1), path);
  run(f, &c, &r);
  expect_done(&r);
  comm_init_n(f, 77, 2, 0);
  tensor_new(f, 1, "f32", 6, &r);
  expect_done(&r);
  tensor_new(f, 2, "f32", 12, &r);
  expect_done(&r);
  return mn_tensor_new(&f->x.reg, 3, MK_F32, 1, shape, err, sizeof(err)) != NULL ? 0 : -1;
}
static int teardown_kcoll(void **state) {
  mn_exec_set_coll(NULL);
  return teardown(state);
}

/* kernel(g, a [, b] [, op | root]) */
static void kc(fix_t *f, const char *kernel, uint64_t g, uint64_t a, uint64_t b, const char *op, int root, reply_t *r) {
  call_t c;
  msgpack_packer *pk = begin(f, &c, kernel, 1 + (a != 0) + (b != 0) + (op != NULL) + (root >= 0));
  msgpack_pack_uint64(pk, g);
  if (a) pack_tensor(pk, a);
  if (b) pack_tensor(pk, b);
  if (op) mn_pack_cstr(pk, op);
  if (root >= 0) msgpack_pack_int(pk, root);
  run(f, &c, r);
}

static void test_kernel_collectives_run_through_nccl(void **state) {
  fix_t *f = *state;
  reply_t r;
  mk_tensor_t *t1 = mn_tensor_get(&f->x.reg, 1), *t2 = mn_tensor_get(&f->x.reg, 2);
  kc(f, "kc_all_reduce", 77, 1, 0, "max", -1, &r);
  expect_done(&r);
  assert_int_equal(F.last_count, 6);
  assert_int_equal(F.last_dtype, 7);
  assert_int_equal(F.last_op, 2);
  assert_ptr_equal(F.last_send, t1->data);
  assert_ptr_equal(F.last_recv, t1->data);
  /* The members agreed on the call over the CPU group first, and met at the kernel's end there. */
  assert_int_equal(C.calls[MN_KCOLL_ALL_GATHER], 1);
  assert_int_equal(C.calls[MN_KCOLL_ALL_REDUCE], 0);
  assert_int_equal(C.calls[MN_KCOLL_FENCE], 1);
  kc(f, "kc_all_reduce", 77, 1, 0, "avg", -1, &r);
  expect_done(&r);
  assert_int_equal(F.last_op, 4);
  kc(f, "kc_broadcast", 77, 2, 0, NULL, 1, &r);
  expect_done(&r);
  assert_int_equal(F.last_root, 1);
  assert_int_equal(F.last_count, 12);
  kc(f, "kc_all_gather", 77, 1, 2, NULL, -1, &r);
  expect_done(&r);
  assert_int_equal(F.last_count, 6);
  assert_ptr_equal(F.last_send, t1->data);
  assert_ptr_equal(F.last_recv, t2->data);
  kc(f, "kc_reduce_scatter", 77, 2, 1, "sum", -1, &r);
  expect_done(&r);
  assert_int_equal(F.last_count, 6);
  assert_int_equal(F.last_op, 0);
  assert_ptr_equal(F.last_send, t2->data);
  assert_ptr_equal(F.last_recv, t1->data);
  /* A barrier drains the stream, then meets the others on the CPU group: no NCCL call. */
  F.last_count = 0;
  kc(f, "kc_barrier", 77, 0, 0, NULL, -1, &r);
  expect_done(&r);
  assert_int_equal(C.calls[MN_KCOLL_BARRIER], 1);
  assert_int_equal(F.last_count, 0);
  assert_int_equal(C.aborted, 0);
  assert_int_equal(F.comms, 1);
  /* Sizes that do not fit the group: all_gather of 6 into 6 on two members. */
  kc(f, "kc_all_gather", 77, 1, 1, NULL, -1, &r);
  expect_fail(&r, "collective", "all_gather: dst must be a separate f32 tensor of 2 x 6 elements (2 members)");
  done(&r);
  assert_int_equal(F.comms, 0); /* the group was given up on, its communicator with it */
  assert_int_equal(F.aborted, 1);
}

static void test_kernel_collectives_refuse_the_wrong_device(void **state) {
  fix_t *f = *state;
  reply_t r;
  kc(f, "kc_all_reduce", 77, 3, 0, "sum", -1, &r);
  expect_fail(&r, "collective", "all_reduce: the tensor is on the CPU but group 77 is a GPU group "
                                "(mesh:group{ gpu = true }); pass GPU tensors, or make a group with mesh:group()");
  done(&r);
  assert_true(C.aborted >= 1); /* the other members are told at once */
  assert_int_equal(F.comms, 0);
  kc(f, "kc_all_reduce", 78, 1, 0, "sum", -1, &r);
  expect_fail(&r, "collective", "all_reduce: the tensor is on cuda:0 but group 78 has no NCCL communicator; make the "
                                "group with mesh:group{ gpu = true }");
  done(&r);
  comm_init_n(f, 79, 2, 0);
  kc(f, "kc_all_gather", 79, 3, 2, NULL, -1, &r);
  expect_fail(&r, "collective", "all_gather: src is on the CPU but dst is on cuda:0; a collective's tensors must be "
                                "on one device");
  done(&r);
  assert_int_equal(F.comms, 0);
  assert_int_equal(F.last_count, 0); /* NCCL never ran */
}

static void test_kernel_collectives_that_differ_are_a_mismatch(void **state) {
  fix_t *f = *state;
  reply_t r;
  C.peer_differs = 1;
  kc(f, "kc_all_reduce", 77, 1, 0, "sum", -1, &r);
  expect_fail(&r, "collective_mismatch", "rank 1 called broadcast(root 1, f32) of 6 elements but rank 0 called "
                                         "all_reduce(sum, f32) of 6 elements on GPU group 77");
  done(&r);
  assert_int_equal(F.last_count, 0); /* NCCL never ran: it would have hung or mixed the data */
  assert_int_equal(F.comms, 0);
  assert_true(C.aborted >= 1);
}

/* A peer that aborts mid-collective (NCCL's async error), a stuck one (the timeout) and a cancel: each ends the wait. */
static void test_kernel_collective_fails_fast_when_a_peer_aborts(void **state) {
  fix_t *f = *state;
  reply_t r;
  F.hang = 1;
  F.async_rc = 6;
  double t0 = mn_now_s();
  kc(f, "kc_all_reduce", 77, 1, 0, "sum", -1, &r);
  expect_fail(&r, "collective", "all_reduce failed: remote process exited or there was a network error");
  done(&r);
  assert_true(mn_now_s() - t0 < 1.0); /* not MN_GPU_COLL_TIMEOUT_S */
  assert_int_equal(F.aborted, 1);
  assert_int_equal(F.comms, 0);
  assert_true(C.aborted >= 1);
  F.async_rc = 0;
  setenv("MONARCH_GPU_TIMEOUT", "0.05", 1);
  mn__gpu_reset(&fake_rt, &fake_nccl); /* forgets the cached timeout */
  comm_init_n(f, 77, 2, 0);
  F.not_ready = 1;
  kc(f, "kc_barrier", 77, 0, 0, NULL, -1, &r);
  expect_fail(&r, "collective", "barrier on communicator 77 timed out");
  done(&r);
  F.not_ready = 0;
  comm_init_n(f, 77, 2, 0);
  F.hang = 1;
  atomic_store(&f->cancel, 1);
  kc(f, "kc_all_reduce", 77, 1, 0, "sum", -1, &r);
  assert_false(r.ok);
  assert_string_equal(r.kind, "cancelled");
  done(&r);
  atomic_store(&f->cancel, 0);
  assert_int_equal(F.comms, 0);
}
#else
static void test_tensors_need_the_registry_hooks(void **state) {
  fix_t *f = *state;
  reply_t r;
  tensor_new(f, 7, "f32", 4, &r);
  expect_fail(&r, "bad_args", "GPU tensors need the registry's device hooks");
  done(&r);
}
#endif

int main(void) {
  if (mn_gpu_register() != 0 || mn_gpu_register() != 0) {
    fprintf(stderr, "test_gpu: cannot register the GPU built-ins\n");
    return 1;
  }
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_bogus_runtime_is_a_clear_error, setup_real, teardown),
    cmocka_unit_test_setup_teardown(test_real_runtime_answers_or_explains, setup_real, teardown),
    cmocka_unit_test_setup_teardown(test_bogus_nccl_is_a_clear_error, setup_fake_runtime, teardown),
    cmocka_unit_test(test_pin_narrows_the_visible_devices),
    cmocka_unit_test_setup_teardown(test_info_describes_the_device, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_no_device_is_a_clear_error, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_bad_arguments_are_named, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_cpu_tensors_are_refused, setup_fake, teardown),
#ifdef MN_DEVICE_HOOKS
    cmocka_unit_test_setup_teardown(test_tensors_live_in_device_memory, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_allocation_failure_is_a_gpu_error, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_collectives_reach_nccl, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_nccl_init_checks_its_arguments, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_stuck_collective_aborts_its_communicator, setup_fake, teardown),
    cmocka_unit_test_setup_teardown(test_kernel_collectives_run_through_nccl, setup_kcoll, teardown_kcoll),
    cmocka_unit_test_setup_teardown(test_kernel_collectives_refuse_the_wrong_device, setup_kcoll, teardown_kcoll),
    cmocka_unit_test_setup_teardown(test_kernel_collectives_that_differ_are_a_mismatch, setup_kcoll, teardown_kcoll),
    cmocka_unit_test_setup_teardown(test_kernel_collective_fails_fast_when_a_peer_aborts, setup_kcoll, teardown_kcoll),
#else
    cmocka_unit_test_setup_teardown(test_tensors_need_the_registry_hooks, setup_fake, teardown),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
#endif /* MN_GPU_FAKE_LIB */
