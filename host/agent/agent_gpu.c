/*
 * agent_gpu.c - the GPU memory of this host's procs, for STATUS
 * (`monarch-run --top`).
 *
 * NVML (libnvidia-ml, the driver's management library that nvidia-smi uses)
 * is loaded with dlopen, so the agent runs on hosts without a GPU;
 * MONARCH_NVML names another library (the tests use a fake). NVML lists the
 * processes that hold memory on each device; a proc it does not list (no
 * GPU, or no CUDA context yet) is unknown, and --top shows "-".
 *
 * NVML is asked on libuv's thread pool, never on the loop: its first call can
 * take a second on a host whose driver is not kept loaded. A STATUS reports
 * what the last query found and starts the next one, so a figure is one
 * STATUS old.
 */
#include "agent_int.h"

#include <dlfcn.h>

#define MN_GPU_MAX_PROCS 1024 /* GPU processes taken per device and remembered per host */
#define NVML_SUCCESS 0
#define NVML_VALUE_NOT_AVAILABLE (~0ULL) /* usedGpuMemory where the driver cannot tell */

typedef int (*nvml_init_fn)(void);
typedef int (*nvml_count_fn)(unsigned int *count);
typedef int (*nvml_handle_fn)(unsigned int index, void **device);
typedef int (*nvml_procs_fn)(void *device, unsigned int *count, void *records);

/* NVML's process records: the _v2 call's adds two ids after the fields of the
 * original's, so pid and memory sit at the same offsets in both. */
typedef struct {
  unsigned int pid;
  unsigned long long used;
} nvml_proc_v1_t;
typedef struct {
  unsigned int pid;
  unsigned long long used;
  unsigned int gpu_instance, compute_instance;
} nvml_proc_v2_t;

typedef struct {
  int64_t pid, bytes;
} gpu_use_t;

/* The worker's side: touched only by the query on the thread pool. */
static struct {
  int loaded; /* 1 loaded, -1 not available */
  nvml_count_fn count;
  nvml_handle_fn handle;
  nvml_procs_fn procs;
  size_t rec_size;
  unsigned char recs[MN_GPU_MAX_PROCS * sizeof(nvml_proc_v2_t)];
  gpu_use_t use[MN_GPU_MAX_PROCS];
  int nuse;
} W;

/* The loop's side. W is read here only in after_query, once the worker is done. */
static struct {
  int state; /* 0 not tried, 1 NVML answers, -1 none here (not asked again) */
  int busy;  /* a query is on the thread pool */
  uv_work_t work;
  gpu_use_t use[MN_GPU_MAX_PROCS];
  int nuse;
} N;

static void *sym(void *h, const char *name) { return dlsym(h, name); }

/* Loads and initialises NVML: 1, or -1 when it is missing or refuses (no driver, no device). */
static int nvml_load(void) {
  const char *path = getenv("MONARCH_NVML");
  void *h = dlopen(path && *path ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return -1;
  nvml_init_fn init;
  void *p = sym(h, "nvmlInit_v2");
  memcpy(&init, &p, sizeof(p)); /* object to function pointer, as dlsym's contract allows */
  p = sym(h, "nvmlDeviceGetCount_v2");
  memcpy(&W.count, &p, sizeof(p));
  p = sym(h, "nvmlDeviceGetHandleByIndex_v2");
  memcpy(&W.handle, &p, sizeof(p));
  W.rec_size = sizeof(nvml_proc_v2_t);
  if ((p = sym(h, "nvmlDeviceGetComputeRunningProcesses_v2")) == NULL) {
    p = sym(h, "nvmlDeviceGetComputeRunningProcesses");
    W.rec_size = sizeof(nvml_proc_v1_t);
  }
  memcpy(&W.procs, &p, sizeof(p));
  if (init == NULL || W.count == NULL || W.handle == NULL || W.procs == NULL || init() != NVML_SUCCESS) {
    dlclose(h);
    return -1;
  }
  return 1; /* kept loaded and initialised for the agent's life */
}

/* Adds bytes to pid's total in W.use (a proc may hold memory on several devices). */
static void add_use(int64_t pid, int64_t bytes) {
  for (int i = 0; i < W.nuse; i++)
    if (W.use[i].pid == pid) {
      W.use[i].bytes += bytes;
      return;
    }
  if (W.nuse < MN_GPU_MAX_PROCS) W.use[W.nuse++] = (gpu_use_t){pid, bytes};
}

/* On the thread pool: every device's compute processes into W.use. */
static void query(uv_work_t *w) {
  (void)w;
  W.nuse = 0;
  if (W.loaded == 0) W.loaded = nvml_load();
  unsigned int ndev = 0;
  if (W.loaded < 0 || W.count(&ndev) != NVML_SUCCESS) return;
  for (unsigned int d = 0; d < ndev; d++) {
    void *dev = NULL;
    unsigned int n = MN_GPU_MAX_PROCS;
    /* Too many processes for the buffer is an error that fills nothing: that device is left out. */
    if (W.handle(d, &dev) != NVML_SUCCESS || W.procs(dev, &n, W.recs) != NVML_SUCCESS) continue;
    for (unsigned int i = 0; i < n && i < MN_GPU_MAX_PROCS; i++) {
      const nvml_proc_v1_t *r = (const nvml_proc_v1_t *)(W.recs + i * W.rec_size);
      if (r->used != NVML_VALUE_NOT_AVAILABLE) add_use((int64_t)r->pid, (int64_t)r->used);
    }
  }
}

static void after_query(uv_work_t *w, int status) {
  (void)w;
  N.busy = 0;
  if (status != 0) return; /* cancelled */
  N.state = W.loaded;
  N.nuse = W.nuse;
  memcpy(N.use, W.use, sizeof(gpu_use_t) * (size_t)W.nuse);
}

void mn__agent_gpu_refresh(uv_loop_t *loop) {
  if (N.state == 0 && getenv("MONARCH_NVML") == NULL && access("/dev/nvidiactl", F_OK) != 0)
    N.state = -1; /* no NVIDIA driver: no thread is started to find that out */
  if (N.state < 0 || N.busy) return;
  N.busy = 1;
  if (uv_queue_work(loop, &N.work, query, after_query) != 0) N.busy = 0;
}

int64_t mn__agent_gpu_bytes(int64_t pid) {
  for (int i = 0; i < N.nuse; i++)
    if (N.use[i].pid == pid) return N.use[i].bytes;
  return -1;
}
