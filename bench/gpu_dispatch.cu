/*
 * gpu_dispatch.cu - the bare-CUDA baselines that bench/gpu.sh puts next to
 * monarch's own figures, measured in the same run on the same GPU:
 *
 *   launch_sync_us      one empty kernel launch + cudaStreamSynchronize, the
 *                       floor under a monarch call of cuda_basic's "noop"
 *   nccl <bytes> ...    ncclAllReduce (f32 sum, in place) + stream sync on a
 *                       communicator of one rank: the floor under
 *                       gpu_all_reduce with one proc on one GPU
 *
 *   gpu_dispatch [launches] [nccl_min_bytes nccl_max_bytes]
 *
 * Prints "name value" lines. NCCL is loaded with dlopen (MONARCH_NCCL, else
 * libnccl.so.2) so that this builds where nccl.h is not installed; without
 * NCCL the nccl lines say why and the exit code is still 0 (the launch
 * figure stands alone). Any CUDA failure exits 1.
 */
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define BATCHES 10           /* timed batches; the median is reported */
#define NCCL_ITERS_MIN 5     /* fewest all_reduces per timed batch */
#define NCCL_BYTES_PER_BATCH (8ull << 30) /* bytes reduced per batch, so large sizes stay short */

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define CHECK(call)                                                                              \
  do {                                                                                           \
    cudaError_t rc_ = (call);                                                                    \
    if (rc_ != cudaSuccess) {                                                                    \
      fprintf(stderr, "gpu_dispatch: %s failed: %s\n", #call, cudaGetErrorString(rc_));         \
      exit(1);                                                                                   \
    }                                                                                            \
  } while (0)

__global__ void empty_k() {}

static void bench_launch(int n) {
  for (int i = 0; i < 1000; i++) empty_k<<<1, 1>>>();
  CHECK(cudaStreamSynchronize(0));
  std::vector<double> per;
  for (int b = 0; b < BATCHES; b++) {
    double t0 = now_us();
    for (int i = 0; i < n; i++) {
      empty_k<<<1, 1>>>();
      CHECK(cudaGetLastError());
      CHECK(cudaStreamSynchronize(0));
    }
    per.push_back((now_us() - t0) / n);
  }
  printf("launch_sync_us %.2f\n", median(per));
}

/* The NCCL entry points used, declared as in nccl.h. */
typedef struct { char internal[128]; } nccl_id_t;
typedef int (*get_id_fn)(nccl_id_t *);
typedef int (*init_fn)(void **, int, nccl_id_t, int);
typedef int (*all_reduce_fn)(const void *, void *, size_t, int, int, void *, cudaStream_t);
typedef int (*destroy_fn)(void *);
typedef const char *(*error_string_fn)(int);
typedef int (*version_fn)(int *);

static void bench_nccl(size_t lo, size_t hi) {
  const char *lib = getenv("MONARCH_NCCL");
  void *h = dlopen(lib && *lib ? lib : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    printf("nccl_unavailable %s\n", dlerror());
    return;
  }
  get_id_fn get_id = (get_id_fn)dlsym(h, "ncclGetUniqueId");
  init_fn init = (init_fn)dlsym(h, "ncclCommInitRank");
  all_reduce_fn all_reduce = (all_reduce_fn)dlsym(h, "ncclAllReduce");
  destroy_fn destroy = (destroy_fn)dlsym(h, "ncclCommDestroy");
  error_string_fn estr = (error_string_fn)dlsym(h, "ncclGetErrorString");
  version_fn version = (version_fn)dlsym(h, "ncclGetVersion");
  if (!get_id || !init || !all_reduce || !destroy || !estr || !version) {
    printf("nccl_unavailable the loaded libnccl lacks an entry point\n");
    return;
  }
  int v = 0, rc;
  nccl_id_t id;
  void *comm = NULL;
  if ((rc = version(&v)) != 0 || (rc = get_id(&id)) != 0 || (rc = init(&comm, 1, id, 0)) != 0) {
    fprintf(stderr, "gpu_dispatch: NCCL setup failed: %s\n", estr(rc));
    exit(1);
  }
  printf("nccl_version %d\n", v);
  void *buf = NULL;
  CHECK(cudaMalloc(&buf, hi));
  CHECK(cudaMemset(buf, 0, hi));
  for (size_t bytes = lo; bytes <= hi; bytes *= 2) {
    size_t count = bytes / 4;
    int iters = (int)std::max<unsigned long long>(NCCL_ITERS_MIN, NCCL_BYTES_PER_BATCH / bytes);
    if (iters > 200) iters = 200;
    std::vector<double> per;
    for (int b = -1; b < BATCHES; b++) { /* batch -1 warms up */
      double t0 = now_us();
      for (int i = 0; i < iters; i++) {
        if ((rc = all_reduce(buf, buf, count, 7 /* ncclFloat32 */, 0 /* ncclSum */, comm, 0)) != 0) {
          fprintf(stderr, "gpu_dispatch: ncclAllReduce failed: %s\n", estr(rc));
          exit(1);
        }
        CHECK(cudaStreamSynchronize(0));
      }
      if (b >= 0) per.push_back((now_us() - t0) / iters);
    }
    double us = median(per);
    printf("nccl %zu %.2f %.2f\n", bytes, us, bytes / us / 1e3);
  }
  CHECK(cudaFree(buf));
  if ((rc = destroy(comm)) != 0) fprintf(stderr, "gpu_dispatch: ncclCommDestroy: %s\n", estr(rc));
}

int main(int argc, char **argv) {
  int launches = argc > 1 ? atoi(argv[1]) : 2000;
  size_t lo = argc > 3 ? strtoull(argv[2], NULL, 10) : 0, hi = argc > 3 ? strtoull(argv[3], NULL, 10) : 0;
  int n = 0;
  cudaDeviceProp p;
  CHECK(cudaGetDeviceCount(&n));
  CHECK(cudaGetDeviceProperties(&p, 0));
  printf("device %s\n", p.name);
  if (launches > 0) bench_launch(launches);
  if (lo > 0 && hi >= lo) bench_nccl(lo, hi);
  return 0;
}
