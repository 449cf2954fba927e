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
#include "fake_gpu.h"

/* Starts the never-ending all_reduce and appends this proc's pid to the file
 * MONARCH_FAKEGPU_HUNG names, if any: gpu_spec.lua polls it to know that every
 * member waits on its stream, instead of sleeping a guessed time. */
static void hang_and_tell(void) {
  F.hang = 1;
  const char *path = getenv("MONARCH_FAKEGPU_HUNG");
  FILE *f = path && *path ? fopen(path, "a") : NULL;
  if (f == NULL) return;
  fprintf(f, "%d\n", (int)getpid());
  fclose(f);
}

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
  if (count == 17) hang_and_tell();
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
