/* gpu_load.c - the CUDA runtime and NCCL, dlopen()ed on first use (the worker links neither); see gpu.h. */
#include "gpu_int.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

mn__gpu_t mn__gpu = {.cur = -1};

static mn__gpu_t *const G = &mn__gpu; /* the name the three files use for it */

/* ---- loading ------------------------------------------------------------------- */

/* Opens the first library of `names` that loads, or the one `env` names.
 * Returns the handle or NULL with `why` saying what was tried. */
static void *open_first(const char *what, const char *env, const char *const *names, int n, char *why,
                        size_t whylen) {
  const char *forced = getenv(env);
  if (forced != NULL && forced[0] != '\0') {
    void *h = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) snprintf(why, whylen, "%s: %s not found (%s): %s", what, forced, env, dlerror());
    return h;
  }
  char tried[256] = "";
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h != NULL) return h;
    int w = snprintf(tried + off, sizeof(tried) - off, "%s%s", i ? ", " : "", names[i]);
    if (w > 0 && (size_t)w < sizeof(tried) - off) off += (size_t)w;
  }
  snprintf(why, whylen, "%s: %s not found (tried %s; set %s to its path)", what, names[n - 1], tried, env);
  return NULL;
}

/* Resolves `name` into *slot; on failure appends it to `missing`. */
static void resolve(void *h, const char *name, void *slot, char *missing, size_t mlen) {
  void *p = dlsym(h, name);
  if (p == NULL) {
    size_t used = strlen(missing);
    snprintf(missing + used, mlen - used, "%s%s", used ? ", " : "", name);
  }
  memcpy(slot, &p, sizeof(p)); /* object to function pointer, as dlsym's contract allows */
}

/* 0, or MN_ENOTFOUND with the reason in G->rt_why (no runtime, or one lacking entry points). */
static int load_cudart(void) {
  static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so",
                                      "/usr/local/cuda/lib64/libcudart.so"};
  char missing[256] = "";
  void *h = open_first("no CUDA runtime on this host", "MONARCH_CUDART", names, 4, G->rt_why,
                       sizeof(G->rt_why));
  if (h == NULL) return MN_ENOTFOUND;
  mn_cudart_t *r = &G->rt;
  resolve(h, "cudaGetDeviceCount", &r->GetDeviceCount, missing, sizeof(missing));
  resolve(h, "cudaSetDevice", &r->SetDevice, missing, sizeof(missing));
  resolve(h, "cudaMalloc", &r->Malloc, missing, sizeof(missing));
  resolve(h, "cudaFree", &r->Free, missing, sizeof(missing));
  resolve(h, "cudaMemset", &r->Memset, missing, sizeof(missing));
  resolve(h, "cudaMemcpy", &r->Memcpy, missing, sizeof(missing));
  resolve(h, "cudaDeviceSynchronize", &r->DeviceSynchronize, missing, sizeof(missing));
  resolve(h, "cudaStreamQuery", &r->StreamQuery, missing, sizeof(missing));
  resolve(h, "cudaMemGetInfo", &r->MemGetInfo, missing, sizeof(missing));
  resolve(h, "cudaDeviceGetAttribute", &r->DeviceGetAttribute, missing, sizeof(missing));
  resolve(h, "cudaRuntimeGetVersion", &r->RuntimeGetVersion, missing, sizeof(missing));
  resolve(h, "cudaDriverGetVersion", &r->DriverGetVersion, missing, sizeof(missing));
  resolve(h, "cudaGetErrorString", &r->GetErrorString, missing, sizeof(missing));
  resolve(h, "cudaGetLastError", &r->GetLastError, missing, sizeof(missing));
  /* CUDA 12 exports the current struct layout as _v2; 11 and 13 use the plain name. */
  char unused[256] = "";
  resolve(h, "cudaGetDeviceProperties_v2", &r->GetDeviceProperties, unused, sizeof(unused));
  if (r->GetDeviceProperties == NULL)
    resolve(h, "cudaGetDeviceProperties", &r->GetDeviceProperties, missing, sizeof(missing));
  if (missing[0] != '\0') {
    snprintf(G->rt_why, sizeof(G->rt_why), "no usable CUDA runtime: the loaded libcudart lacks %s", missing);
    return MN_ENOTFOUND;
  }
  return 0;
}

/* Loads the runtime and counts devices, once. Returns 0, or MN_ENOTFOUND with
 * err set (the same reason every time) and x->err_kind "no_gpu". */
int mn__gpu_cuda_ready(mn_exec_t *x, char *err, size_t errlen) {
  if (!G->rt_tried) {
    G->rt_tried = 1;
    if (G->fake_rt != NULL) G->rt = *G->fake_rt;
    if (G->fake_rt != NULL || load_cudart() == 0) {
      int n = 0, rc = G->rt.GetDeviceCount(&n);
      if (rc != CUDA_SUCCESS) {
        int drv = 0;
        if (G->rt.DriverGetVersion(&drv) != CUDA_SUCCESS) drv = 0;
        snprintf(G->rt_why, sizeof(G->rt_why), "no CUDA device: cudaGetDeviceCount failed: %s%s",
                 G->rt.GetErrorString(rc), drv == 0 ? " (no NVIDIA driver is loaded on this host)" : "");
      } else if (n <= 0) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        snprintf(G->rt_why, sizeof(G->rt_why), "no CUDA device: the CUDA runtime sees 0 devices%s%s%s",
                 vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", vis ? ")" : "");
      } else {
        G->ndev = n;
        G->rt_ok = 1;
      }
    }
  }
  if (G->rt_ok) return 0;
  if (x != NULL) x->err_kind = "no_gpu";
  snprintf(err, errlen, "%s", G->rt_why);
  return MN_ENOTFOUND;
}

/* Makes `dev` current on this thread; 0, or with err cuda_ready's code, MN_EINVAL (no such device) or MN_EDEVICE. */
int mn__gpu_use_device(mn_exec_t *x, int dev, char *err, size_t errlen) {
  int rc = mn__gpu_cuda_ready(x, err, errlen);
  if (rc != 0) return rc;
  if (dev < 0 || dev >= G->ndev) {
    snprintf(err, errlen, "device %d does not exist: this proc sees %d CUDA device%s (0..%d)", dev, G->ndev,
             G->ndev == 1 ? "" : "s", G->ndev - 1);
    return MN_EINVAL;
  }
  /* Set every time: a kernel library may have switched this thread's device. */
  rc = G->rt.SetDevice(dev);
  if (rc != CUDA_SUCCESS) {
    if (x != NULL) x->err_kind = "gpu";
    snprintf(err, errlen, "cudaSetDevice(%d) failed: %s", dev, G->rt.GetErrorString(rc));
    return MN_EDEVICE;
  }
  G->cur = dev;
  return 0;
}

/* Reports a failed CUDA call: "what failed: <CUDA's message>". Returns MN_EDEVICE. */
int mn__gpu_cuda_fail(mn_exec_t *x, int rc, const char *what, char *err, size_t errlen) {
  x->err_kind = "gpu";
  snprintf(err, errlen, "%s failed: %s", what, G->rt.GetErrorString(rc));
  return MN_EDEVICE;
}

/* 0, or MN_ENOTFOUND with the reason in G->nccl_why. */
static int load_nccl(void) {
  static const char *const names[] = {"libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib64/libnccl.so.2"};
  char missing[256] = "";
  void *h = open_first("NCCL is not available on this host", "MONARCH_NCCL", names, 3, G->nccl_why,
                       sizeof(G->nccl_why));
  if (h == NULL) return MN_ENOTFOUND;
  mn_nccl_t *n = &G->nccl;
  resolve(h, "ncclGetVersion", &n->GetVersion, missing, sizeof(missing));
  resolve(h, "ncclGetUniqueId", &n->GetUniqueId, missing, sizeof(missing));
  resolve(h, "ncclCommInitRank", &n->CommInitRank, missing, sizeof(missing));
  resolve(h, "ncclCommDestroy", &n->CommDestroy, missing, sizeof(missing));
  resolve(h, "ncclCommAbort", &n->CommAbort, missing, sizeof(missing));
  resolve(h, "ncclCommGetAsyncError", &n->CommGetAsyncError, missing, sizeof(missing));
  resolve(h, "ncclAllReduce", &n->AllReduce, missing, sizeof(missing));
  resolve(h, "ncclBroadcast", &n->Broadcast, missing, sizeof(missing));
  resolve(h, "ncclAllGather", &n->AllGather, missing, sizeof(missing));
  resolve(h, "ncclReduceScatter", &n->ReduceScatter, missing, sizeof(missing));
  resolve(h, "ncclGetErrorString", &n->GetErrorString, missing, sizeof(missing));
  char unused[256] = "";
  resolve(h, "ncclGetLastError", &n->GetLastError, unused, sizeof(unused));
  if (missing[0] != '\0') {
    snprintf(G->nccl_why, sizeof(G->nccl_why), "NCCL is not usable: the loaded libnccl lacks %s", missing);
    return MN_ENOTFOUND;
  }
  return 0;
}

/* Loads NCCL, once. Returns 0, or MN_ENOTFOUND with err and x->err_kind "no_gpu". */
int mn__gpu_nccl_ready(mn_exec_t *x, char *err, size_t errlen) {
  int rc = mn__gpu_cuda_ready(x, err, errlen);
  if (rc != 0) return rc;
  if (!G->nccl_tried) {
    G->nccl_tried = 1;
    if (G->fake_nccl != NULL) G->nccl = *G->fake_nccl;
    G->nccl_ok = G->fake_nccl != NULL || load_nccl() == 0;
  }
  if (G->nccl_ok) return 0;
  x->err_kind = "no_gpu";
  snprintf(err, errlen, "%s", G->nccl_why);
  return MN_ENOTFOUND;
}

/* "what failed: ncclInvalidUsage text (NCCL's last error)". Returns MN_EDEVICE. */
int mn__gpu_nccl_fail(mn_exec_t *x, int rc, void *comm, const char *what, char *err, size_t errlen) {
  const char *last = G->nccl.GetLastError ? G->nccl.GetLastError(comm) : NULL;
  x->err_kind = "gpu";
  snprintf(err, errlen, "%s failed: %s%s%s%s", what, G->nccl.GetErrorString(rc), last && *last ? " (" : "",
           last && *last ? last : "", last && *last ? ")" : "");
  return MN_EDEVICE;
}

/* ---- pinning and resetting -------------------------------------------------------- */

int mn_gpu_pin(int device, char *err, size_t errlen) {
  const char *vis = getenv("CUDA_VISIBLE_DEVICES");
  char one[MN_GPU_MAX_VISIBLE];
  if (device < 0) {
    snprintf(err, errlen, "cannot pin to GPU %d: devices are numbered from 0", device);
    return MN_EINVAL;
  }
  if (vis == NULL || vis[0] == '\0') {
    snprintf(one, sizeof(one), "%d", device);
  } else {
    /* The device-th comma-separated entry, as CUDA itself reads the list. */
    const char *p = vis;
    for (int i = 0; i < device && p != NULL; i++) {
      p = strchr(p, ',');
      if (p != NULL) p++;
    }
    size_t n = p ? strcspn(p, ",") : 0;
    if (p == NULL || n == 0 || n >= sizeof(one)) {
      snprintf(err, errlen, "cannot pin to GPU %d: CUDA_VISIBLE_DEVICES=%.200s lists fewer devices", device, vis);
      return MN_EINVAL;
    }
    memcpy(one, p, n);
    one[n] = '\0';
  }
  if (setenv("CUDA_VISIBLE_DEVICES", one, 1) != 0) {
    int e = errno;
    snprintf(err, errlen, "cannot pin to GPU %d: setenv failed", device);
    return -e;
  }
  return 0;
}

void mn__gpu_reset(const mn_cudart_t *rt, const mn_nccl_t *nccl) {
  mn__gpu_comm_reset(); /* first: aborting the communicators needs the NCCL still loaded */
  /* Libraries stay mapped: unloading the CUDA runtime mid-process is not safe. */
  memset(G, 0, sizeof(*G));
  G->cur = -1;
  G->fake_rt = rt;
  G->fake_nccl = nccl;
}
