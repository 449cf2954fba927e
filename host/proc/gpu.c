/* gpu.c - CUDA device memory and NCCL collectives for a proc; see gpu.h. */
#include "gpu.h"

#include "clock.h"
#include "collective.h"

#include "exec.h"
#include "registry.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MN_GPU_WHY 512             /* longest reason CUDA or NCCL cannot be used */
#define MN_GPU_PROPS_BYTES 16384   /* room for any CUDA version's cudaDeviceProp */
#define MN_GPU_MIN_ALLOC 256       /* bytes allocated for an empty tensor */
#define MN_GPU_POLL_EVERY 256      /* stream polls between checks of cancel, timeout, NCCL errors */

/* The few CUDA and NCCL constants used, from their public headers (checked
 * against them by mk/cuda.mk's gpu-abi-check when the toolkit is present). */
#define CUDA_SUCCESS 0
#define CUDA_NOT_READY 600
#define CUDA_H2D 1
#define CUDA_D2H 2
#define CUDA_ATTR_CC_MAJOR 75
#define CUDA_ATTR_CC_MINOR 76
#define NCCL_SUCCESS 0
#define NCCL_IN_PROGRESS 7

#ifdef MN_GPU_ABI_CHECK /* mk/cuda.mk compiles this file once more against the real headers */
#include <cuda_runtime_api.h>
_Static_assert(CUDA_SUCCESS == cudaSuccess && CUDA_NOT_READY == cudaErrorNotReady, "cudaError_t");
_Static_assert(CUDA_H2D == cudaMemcpyHostToDevice && CUDA_D2H == cudaMemcpyDeviceToHost, "cudaMemcpyKind");
_Static_assert(CUDA_ATTR_CC_MAJOR == cudaDevAttrComputeCapabilityMajor &&
               CUDA_ATTR_CC_MINOR == cudaDevAttrComputeCapabilityMinor, "cudaDeviceAttr");
_Static_assert(sizeof(cudaError_t) == sizeof(int) && sizeof(cudaStream_t) == sizeof(void *), "CUDA types");
#if __has_include(<nccl.h>)
#include <nccl.h>
_Static_assert(NCCL_SUCCESS == ncclSuccess && NCCL_IN_PROGRESS == ncclInProgress, "ncclResult_t");
_Static_assert(sizeof(mn_nccl_id_t) == sizeof(ncclUniqueId) && MN_GPU_NCCL_ID_BYTES == NCCL_UNIQUE_ID_BYTES, "id");
_Static_assert(ncclUint8 == 1 && ncclInt32 == 2 && ncclInt64 == 4 && ncclFloat16 == 6 && ncclFloat32 == 7 &&
               ncclFloat64 == 8 && ncclBfloat16 == 9, "ncclDataType_t");
_Static_assert(ncclSum == 0 && ncclMax == 2 && ncclMin == 3 && ncclAvg == 4, "ncclRedOp_t");
_Static_assert(sizeof(ncclDataType_t) == sizeof(int) && sizeof(ncclComm_t) == sizeof(void *), "NCCL types");
#endif
#endif

typedef struct {
  uint64_t id;
  void *comm;   /* ncclComm_t */
  int nranks;
  int rank;
  int device;
  uint64_t watch; /* a collective group of the same procs whose links tell when one dies (0: none) */
} comm_t;

/* One per process: the proc has one executor thread. */
static struct {
  int rt_tried;                 /* a load of the runtime was attempted */
  int rt_ok;
  mn_cudart_t rt;
  char rt_why[MN_GPU_WHY];      /* why the runtime or device cannot be used */
  int ndev;
  int cur;                      /* device use_device last made current, -1 none */
  const mn_cudart_t *fake_rt;   /* tests: use this instead of dlopen */
  int nccl_tried;
  int nccl_ok;
  mn_nccl_t nccl;
  char nccl_why[MN_GPU_WHY];
  const mn_nccl_t *fake_nccl;
  comm_t comms[MN_GPU_MAX_COMMS];
  int ncomms;
  double timeout_s;
  int alloc_failed;             /* the last device allocation failed (error kind "gpu") */
} G = {.cur = -1};

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

/* 0, or MN_ENOTFOUND with the reason in G.rt_why (no runtime, or one lacking entry points). */
static int load_cudart(void) {
  static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so",
                                      "/usr/local/cuda/lib64/libcudart.so"};
  char missing[256] = "";
  void *h = open_first("no CUDA runtime on this host", "MONARCH_CUDART", names, 4, G.rt_why,
                       sizeof(G.rt_why));
  if (h == NULL) return MN_ENOTFOUND;
  mn_cudart_t *r = &G.rt;
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
    snprintf(G.rt_why, sizeof(G.rt_why), "no usable CUDA runtime: the loaded libcudart lacks %s", missing);
    return MN_ENOTFOUND;
  }
  return 0;
}

/* Loads the runtime and counts devices, once. Returns 0, or MN_ENOTFOUND with
 * err set (the same reason every time) and x->err_kind "no_gpu". */
static int cuda_ready(mn_exec_t *x, char *err, size_t errlen) {
  if (!G.rt_tried) {
    G.rt_tried = 1;
    if (G.fake_rt != NULL) G.rt = *G.fake_rt;
    if (G.fake_rt != NULL || load_cudart() == 0) {
      int n = 0, rc = G.rt.GetDeviceCount(&n);
      if (rc != CUDA_SUCCESS) {
        int drv = 0;
        if (G.rt.DriverGetVersion(&drv) != CUDA_SUCCESS) drv = 0;
        snprintf(G.rt_why, sizeof(G.rt_why), "no CUDA device: cudaGetDeviceCount failed: %s%s",
                 G.rt.GetErrorString(rc), drv == 0 ? " (no NVIDIA driver is loaded on this host)" : "");
      } else if (n <= 0) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        snprintf(G.rt_why, sizeof(G.rt_why), "no CUDA device: the CUDA runtime sees 0 devices%s%s%s",
                 vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", vis ? ")" : "");
      } else {
        G.ndev = n;
        G.rt_ok = 1;
      }
    }
  }
  if (G.rt_ok) return 0;
  if (x != NULL) x->err_kind = "no_gpu";
  snprintf(err, errlen, "%s", G.rt_why);
  return MN_ENOTFOUND;
}

/* Makes `dev` current on this thread; 0, or with err cuda_ready's code, MN_EINVAL (no such device) or MN_EDEVICE. */
static int use_device(mn_exec_t *x, int dev, char *err, size_t errlen) {
  int rc = cuda_ready(x, err, errlen);
  if (rc != 0) return rc;
  if (dev < 0 || dev >= G.ndev) {
    snprintf(err, errlen, "device %d does not exist: this proc sees %d CUDA device%s (0..%d)", dev, G.ndev,
             G.ndev == 1 ? "" : "s", G.ndev - 1);
    return MN_EINVAL;
  }
  /* Set every time: a kernel library may have switched this thread's device. */
  rc = G.rt.SetDevice(dev);
  if (rc != CUDA_SUCCESS) {
    if (x != NULL) x->err_kind = "gpu";
    snprintf(err, errlen, "cudaSetDevice(%d) failed: %s", dev, G.rt.GetErrorString(rc));
    return MN_EDEVICE;
  }
  G.cur = dev;
  return 0;
}

/* Reports a failed CUDA call: "what failed: <CUDA's message>". Returns MN_EDEVICE. */
static int cuda_fail(mn_exec_t *x, int rc, const char *what, char *err, size_t errlen) {
  x->err_kind = "gpu";
  snprintf(err, errlen, "%s failed: %s", what, G.rt.GetErrorString(rc));
  return MN_EDEVICE;
}

/* 0, or MN_ENOTFOUND with the reason in G.nccl_why. */
static int load_nccl(void) {
  static const char *const names[] = {"libnccl.so.2", "libnccl.so", "/usr/local/cuda/lib64/libnccl.so.2"};
  char missing[256] = "";
  void *h = open_first("NCCL is not available on this host", "MONARCH_NCCL", names, 3, G.nccl_why,
                       sizeof(G.nccl_why));
  if (h == NULL) return MN_ENOTFOUND;
  mn_nccl_t *n = &G.nccl;
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
    snprintf(G.nccl_why, sizeof(G.nccl_why), "NCCL is not usable: the loaded libnccl lacks %s", missing);
    return MN_ENOTFOUND;
  }
  return 0;
}

/* Loads NCCL, once. Returns 0, or MN_ENOTFOUND with err and x->err_kind "no_gpu". */
static int nccl_ready(mn_exec_t *x, char *err, size_t errlen) {
  int rc = cuda_ready(x, err, errlen);
  if (rc != 0) return rc;
  if (!G.nccl_tried) {
    G.nccl_tried = 1;
    if (G.fake_nccl != NULL) G.nccl = *G.fake_nccl;
    G.nccl_ok = G.fake_nccl != NULL || load_nccl() == 0;
  }
  if (G.nccl_ok) return 0;
  x->err_kind = "no_gpu";
  snprintf(err, errlen, "%s", G.nccl_why);
  return MN_ENOTFOUND;
}

/* "what failed: ncclInvalidUsage text (NCCL's last error)". Returns MN_EDEVICE. */
static int nccl_fail(mn_exec_t *x, int rc, void *comm, const char *what, char *err, size_t errlen) {
  const char *last = G.nccl.GetLastError ? G.nccl.GetLastError(comm) : NULL;
  x->err_kind = "gpu";
  snprintf(err, errlen, "%s failed: %s%s%s%s", what, G.nccl.GetErrorString(rc), last && *last ? " (" : "",
           last && *last ? last : "", last && *last ? ")" : "");
  return MN_EDEVICE;
}

/* ---- device memory for the registry ----------------------------------------- */

#ifdef MN_DEVICE_HOOKS
static void *dev_alloc(int device, size_t nbytes, char *err, size_t errlen) {
  void *p = NULL;
  size_t n = nbytes < MN_GPU_MIN_ALLOC ? MN_GPU_MIN_ALLOC : nbytes;
  if (use_device(NULL, device, err, errlen) != 0) return NULL;
  int rc = G.rt.Malloc(&p, n);
  G.alloc_failed = rc != CUDA_SUCCESS;
  if (rc != CUDA_SUCCESS) {
    snprintf(err, errlen, "cudaMalloc of %zu bytes on cuda:%d failed: %s", nbytes, device, G.rt.GetErrorString(rc));
    return NULL;
  }
  rc = G.rt.Memset(p, 0, n);
  if (rc != CUDA_SUCCESS) {
    G.alloc_failed = 1;
    snprintf(err, errlen, "cudaMemset of %zu bytes on cuda:%d failed: %s", nbytes, device, G.rt.GetErrorString(rc));
    if (G.rt.Free(p) != CUDA_SUCCESS) fprintf(stderr, "monarch proc: cudaFree after a failed cudaMemset failed\n");
    return NULL;
  }
  return p;
}

static void dev_release(int device, void *p) {
  char err[256];
  /* A failure here leaks device memory but must not take the proc down. */
  if (use_device(NULL, device, err, sizeof(err)) != 0) {
    fprintf(stderr, "monarch proc: cannot free device memory: %s\n", err);
    return;
  }
  int rc = G.rt.Free(p);
  if (rc != CUDA_SUCCESS) fprintf(stderr, "monarch proc: cudaFree on cuda:%d failed: %s\n", device, G.rt.GetErrorString(rc));
}

static const mn_device_ops_t device_ops = {dev_alloc, dev_release};

static int proc_device(const mn_exec_t *x) { return x->device >= 0 ? x->device : 0; }
#else
static int proc_device(const mn_exec_t *x) { return 0; }
#endif

/* ---- arguments --------------------------------------------------------------- */

static const msgpack_object *arg(const msgpack_object *args, uint32_t i) {
  return i < args->via.array.size ? &args->via.array.ptr[i] : NULL;
}

/* A GPU tensor argument; NULL with err if absent or on the CPU. */
static mk_tensor_t *gpu_tensor_arg(mn_exec_t *x, const msgpack_object *args, uint32_t i, const char *who,
                                   char *err, size_t errlen) {
  char e[256];
  mk_tensor_t *t = mn_exec_tensor_arg(x, args, i, e, sizeof(e));
  if (t == NULL) {
    snprintf(err, errlen, "%s: %s", who, e);
    return NULL;
  }
  if (t->device < 0) {
    snprintf(err, errlen, "%s: tensor %llu is on the CPU; this needs a GPU tensor", who, (unsigned long long)t->id);
    return NULL;
  }
  return t;
}

static comm_t *find_comm(uint64_t id) {
  for (int i = 0; i < G.ncomms; i++)
    if (G.comms[i].id == id) return &G.comms[i];
  return NULL;
}

static void drop_comm(comm_t *c) {
  if (c->watch != 0) mn_coll_watch_free(c->watch); /* closing its links tells the other members at once */
  *c = G.comms[--G.ncomms];
}

/* The communicator named by argument 0; NULL with err. */
static comm_t *comm_arg(mn_exec_t *x, const msgpack_object *args, const char *who, char *err, size_t errlen) {
  uint64_t id;
  if (nccl_ready(x, err, errlen) != 0) return NULL;
  if (mn_get_u64(args, 0, &id) != 0) {
    snprintf(err, errlen, "%s: argument 1 must be a communicator id (a non-negative integer)", who);
    return NULL;
  }
  comm_t *c = find_comm(id);
  if (c == NULL) snprintf(err, errlen, "%s: communicator %llu does not exist on this proc (call __gpu_nccl_init first)",
                          who, (unsigned long long)id);
  return c;
}

/* NCCL's number for d (>= 0), or MN_EINVAL for a dtype NCCL lacks. */
static int nccl_dtype(mk_dtype_t d) {
  switch (d) {
  case MK_U8: return 1;
  case MK_I32: return 2;
  case MK_I64: return 4;
  case MK_F16: return 6;
  case MK_F32: return 7;
  case MK_F64: return 8;
  case MK_BF16: return 9;
  default: return MN_EINVAL;
  }
}

/* The reduction named by argument i: sum, max, min, avg as NCCL numbers them (>= 0); MN_EINVAL with err. */
static int nccl_op(const msgpack_object *args, uint32_t i, const char *who, char *err, size_t errlen) {
  static const struct { const char *name; int op; } ops[] = {{"sum", 0}, {"max", 2}, {"min", 3}, {"avg", 4}};
  const char *s;
  size_t n;
  if (mn_get_str(args, i, &s, &n) == 0)
    for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++)
      if (strlen(ops[k].name) == n && memcmp(ops[k].name, s, n) == 0) return ops[k].op;
  snprintf(err, errlen, "%s: argument %u must be a reduction: \"sum\", \"max\", \"min\" or \"avg\"", who, i + 1);
  return MN_EINVAL;
}

static double coll_timeout(void) {
  if (G.timeout_s <= 0) {
    const char *e = getenv("MONARCH_GPU_TIMEOUT");
    double v = e ? atof(e) : 0;
    G.timeout_s = v > 0 ? v : MN_GPU_COLL_TIMEOUT_S;
  }
  return G.timeout_s;
}

/*
 * Waits for the collective just enqueued on `stream` (NULL: the legacy
 * default stream, which the built-ins use). A peer that
 * never joins would block a plain cudaStreamSynchronize forever; polling
 * lets a cancel, an NCCL error or the timeout abort the communicator
 * instead, so the proc stays usable. Returns 0, or with err MN_EDEVICE (the
 * device or NCCL reported an error), the watch's code (a member died),
 * MN_ECANCELED or MN_ETIMEDOUT; an aborted communicator is dropped.
 */
static int coll_wait(mn_exec_t *x, mk_ctx_t *ctx, comm_t *c, void *stream, const char *who, char *err,
                     size_t errlen) {
  double deadline = mn_now_s() + coll_timeout();
  const char *why = NULL;
  int rc = MN_EDEVICE;
  for (unsigned i = 1;; i++) {
    int q = G.rt.StreamQuery(stream);
    if (q == CUDA_SUCCESS) return 0;
    if (q != CUDA_NOT_READY) {
      x->err_kind = "gpu";
      snprintf(err, errlen, "%s: the device reported an error: %s", who, G.rt.GetErrorString(q));
      return MN_EDEVICE;
    }
    if (i % MN_GPU_POLL_EVERY == 0) {
      int async = NCCL_SUCCESS;
      if (G.nccl.CommGetAsyncError(c->comm, &async) == NCCL_SUCCESS && async != NCCL_SUCCESS &&
          async != NCCL_IN_PROGRESS) {
        rc = nccl_fail(x, async, c->comm, who, err, errlen);
        break;
      }
      if (c->watch != 0 && (rc = mn_coll_watch(c->watch, who, err, errlen)) != 0) {
        /* NCCL does not notice a dead peer on its own: it would wait for the timeout. */
        x->err_kind = "gpu";
        size_t l = strlen(err);
        snprintf(err + l, errlen - l, "; communicator %llu aborted", (unsigned long long)c->id);
        break;
      }
      if (mk_cancelled(ctx)) {
        why = "cancelled";
        rc = MN_ECANCELED;
      } else if (mn_now_s() > deadline) {
        why = "timed out";
        rc = MN_ETIMEDOUT;
      }
      if (why != NULL) {
        x->err_kind = "gpu";
        snprintf(err, errlen, "%s on communicator %llu %s after %.0f s (did every rank join?); communicator aborted",
                 who, (unsigned long long)c->id, why, coll_timeout());
        break;
      }
    }
    sched_yield();
  }
  if (G.nccl.CommAbort(c->comm) != NCCL_SUCCESS)
    fprintf(stderr, "monarch proc: ncclCommAbort of communicator %llu failed\n", (unsigned long long)c->id);
  drop_comm(c);
  return rc;
}

/* ---- built-ins --------------------------------------------------------------- */

/* __gpu_info() */
static int b_info(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                  size_t errlen) {
  int dev = proc_device(x), major = 0, minor = 0, rtv = 0, drv = 0, rc;
  size_t fb = 0, tb = 0;
  char *props, cc[32];
  if ((rc = use_device(x, dev, err, errlen)) != 0) return rc;
  if ((rc = G.rt.MemGetInfo(&fb, &tb)) != CUDA_SUCCESS) return cuda_fail(x, rc, "cudaMemGetInfo", err, errlen);
  if ((rc = G.rt.DeviceGetAttribute(&major, CUDA_ATTR_CC_MAJOR, dev)) != CUDA_SUCCESS ||
      (rc = G.rt.DeviceGetAttribute(&minor, CUDA_ATTR_CC_MINOR, dev)) != CUDA_SUCCESS)
    return cuda_fail(x, rc, "cudaDeviceGetAttribute", err, errlen);
  if ((rc = G.rt.RuntimeGetVersion(&rtv)) != CUDA_SUCCESS || (rc = G.rt.DriverGetVersion(&drv)) != CUDA_SUCCESS)
    return cuda_fail(x, rc, "cudaRuntimeGetVersion", err, errlen);
  props = calloc(1, MN_GPU_PROPS_BYTES);
  if (props == NULL) {
    snprintf(err, errlen, "__gpu_info: out of memory");
    return MN_ENOMEM;
  }
  rc = G.rt.GetDeviceProperties(props, dev);
  if (rc != CUDA_SUCCESS) {
    free(props);
    return cuda_fail(x, rc, "cudaGetDeviceProperties", err, errlen);
  }
  props[255] = '\0'; /* cudaDeviceProp starts with char name[256] in every version */
  snprintf(cc, sizeof(cc), "%d.%d", major, minor);
  int bad = mk_return_int(ctx, G.ndev) || mk_return_string(ctx, props, strlen(props)) ||
            mk_return_int(ctx, (int64_t)tb) || mk_return_int(ctx, (int64_t)fb) ||
            mk_return_string(ctx, cc, strlen(cc)) || mk_return_int(ctx, rtv) || mk_return_int(ctx, drv) ||
            mk_return_int(ctx, dev);
  free(props);
  return mn_exec_returned(x, bad);
}

/* __gpu_tensor_new(id, dtype, shape, device?) */
static int b_tensor_new(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                        size_t errlen) {
  uint64_t id;
  const char *s;
  size_t sl;
  int64_t shape[MK_MAX_DIMS], dev = -1;
  const msgpack_object *sh = arg(args, 2), *d = arg(args, 3);
  if (mn_get_u64(args, 0, &id) != 0 || mn_get_str(args, 1, &s, &sl) != 0 || sh == NULL ||
      sh->type != MSGPACK_OBJECT_ARRAY || (d != NULL && d->type != MSGPACK_OBJECT_NIL && mn_get_i64(args, 3, &dev) != 0)) {
    snprintf(err, errlen, "%s takes %s", b->name, b->usage);
    return MN_EINVAL;
  }
  int dt, rc;
  rc = mn_exec_dtype_shape(s, sl, sh, &dt, shape, err, errlen);
  if (rc != 0) return rc;
  if (dev < 0) dev = proc_device(x);
  if (dev > INT_MAX) dev = INT_MAX; /* use_device names the valid range */
  rc = use_device(x, (int)dev, err, errlen);
  if (rc != 0) return rc;
#ifdef MN_DEVICE_HOOKS
  G.alloc_failed = 0;
  if (mn_tensor_new_on(&x->reg, id, (mk_dtype_t)dt, (int)sh->via.array.size, shape, (int)dev, err, errlen) != NULL)
    return 0;
  if (G.alloc_failed) x->err_kind = "gpu";
  return G.alloc_failed ? MN_EDEVICE : MN_EINVAL;
#else
  snprintf(err, errlen, "GPU tensors need the registry's device hooks (MN_DEVICE_HOOKS), which this proc lacks");
  return MN_EINVAL;
#endif
}

/* The GPU tensor that __gpu_fetch and __gpu_put copy, on a ready device; NULL with err (and x->err_kind). */
static mk_tensor_t *copy_tensor(mn_exec_t *x, const mn_builtin_t *b, const msgpack_object *args, char *err,
                                size_t errlen) {
  if (cuda_ready(x, err, errlen) != 0) return NULL;
  mk_tensor_t *t = gpu_tensor_arg(x, args, 0, b->name, err, errlen);
  if (t == NULL || use_device(x, t->device, err, errlen) != 0) return NULL;
  return t;
}

/* __gpu_fetch(t) -> bytes (device to host) */
static int b_fetch(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                   size_t errlen) {
  mk_tensor_t *t = copy_tensor(x, b, args, err, errlen);
  if (t == NULL) return MN_EINVAL;
  if (t->nbytes > MN_MAX_FRAME - 64) {
    snprintf(err, errlen, "__gpu_fetch: tensor of %zu bytes is larger than one frame (MN_MAX_FRAME)", t->nbytes);
    return MN_ELIMIT;
  }
  void *host = malloc(t->nbytes ? t->nbytes : 1);
  if (host == NULL) {
    snprintf(err, errlen, "__gpu_fetch: out of host memory for %zu bytes", t->nbytes);
    return MN_ENOMEM;
  }
  int rc = G.rt.Memcpy(host, t->data, t->nbytes, CUDA_D2H);
  if (rc != CUDA_SUCCESS) {
    free(host);
    return cuda_fail(x, rc, "__gpu_fetch: cudaMemcpy device to host", err, errlen);
  }
  int bad = mk_return_bytes(ctx, host, t->nbytes);
  free(host);
  return mn_exec_returned(x, bad);
}

/* __gpu_put(t, bytes): host to device, exactly t's size */
static int b_put(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                 size_t errlen) {
  const char *s;
  size_t sl;
  mk_tensor_t *t = copy_tensor(x, b, args, err, errlen);
  if (t == NULL) return MN_EINVAL;
  if (mn_get_bin(args, 1, &s, &sl) != 0 && mn_get_str(args, 1, &s, &sl) != 0) {
    snprintf(err, errlen, "%s takes %s", b->name, b->usage);
    return MN_EINVAL;
  }
  if (sl != t->nbytes) {
    snprintf(err, errlen, "__gpu_put: %zu bytes into a tensor of %zu bytes", sl, t->nbytes);
    return MN_EINVAL;
  }
  int rc = G.rt.Memcpy(t->data, s, sl, CUDA_H2D);
  return rc == CUDA_SUCCESS ? 0 : cuda_fail(x, rc, "__gpu_put: cudaMemcpy host to device", err, errlen);
}

/* __gpu_free(t) -> true, or false if there was none */
static int b_free(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                  size_t errlen) {
  char e[256];
  const msgpack_object *a = arg(args, 0);
  if (a == NULL || (a->type != MSGPACK_OBJECT_POSITIVE_INTEGER && a->type != MSGPACK_OBJECT_EXT)) {
    snprintf(err, errlen, "__gpu_free takes a tensor (or tensor id)");
    return MN_EINVAL;
  }
  mk_tensor_t *t = mn_exec_tensor_arg(x, args, 0, e, sizeof(e));
  if (t != NULL && t->device < 0) {
    snprintf(err, errlen, "__gpu_free: tensor %llu is on the CPU (free it with __tensor_free)", (unsigned long long)t->id);
    return MN_EINVAL;
  }
  return mn_exec_returned(x, mk_return_bool(ctx, t != NULL && mn_tensor_free(&x->reg, t->id) == 0));
}

/* __gpu_sync() */
static int b_sync(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                  size_t errlen) {
  int rc = use_device(x, proc_device(x), err, errlen);
  if (rc != 0) return rc;
  rc = G.rt.DeviceSynchronize();
  return rc == CUDA_SUCCESS ? 0 : cuda_fail(x, rc, "cudaDeviceSynchronize", err, errlen);
}

/* __gpu_nccl_id() -> 128 bytes */
static int b_nccl_id(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                     size_t errlen) {
  mn_nccl_id_t id;
  int rc = nccl_ready(x, err, errlen);
  if (rc != 0) return rc;
  rc = G.nccl.GetUniqueId(&id);
  if (rc != NCCL_SUCCESS) return nccl_fail(x, rc, NULL, "ncclGetUniqueId", err, errlen);
  return mn_exec_returned(x, mk_return_bytes(ctx, id.internal, sizeof(id.internal)));
}

/* A communicator that was not made does not keep its watch group. Returns rc. */
static int fail_watch(uint64_t watch, int rc) {
  if (watch != 0) mn_coll_watch_free(watch);
  return rc;
}

/* __gpu_nccl_init(comm, id, nranks, rank [, watch group]) */
static int b_nccl_init(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                       size_t errlen) {
  uint64_t cid, watch = 0;
  int64_t nranks, rank;
  const char *s;
  size_t sl;
  mn_nccl_id_t id;
  if (mn_get_u64(args, 0, &cid) != 0 || (mn_get_bin(args, 1, &s, &sl) != 0 && mn_get_str(args, 1, &s, &sl) != 0) ||
      mn_get_i64(args, 2, &nranks) != 0 || mn_get_i64(args, 3, &rank) != 0 ||
      (args->via.array.size > 4 && mn_get_u64(args, 4, &watch) != 0)) {
    snprintf(err, errlen, "%s takes %s", b->name, b->usage);
    return MN_EINVAL;
  }
  if (sl != sizeof(id.internal)) {
    snprintf(err, errlen, "__gpu_nccl_init: the NCCL id must be %d bytes, got %zu", MN_GPU_NCCL_ID_BYTES, sl);
    return fail_watch(watch, MN_EINVAL);
  }
  if (nranks < 1 || nranks > 1 << 20 || rank < 0 || rank >= nranks) {
    snprintf(err, errlen, "__gpu_nccl_init: rank %lld is outside 0..nranks-1 (nranks %lld)", (long long)rank,
             (long long)nranks);
    return fail_watch(watch, MN_EINVAL);
  }
  int rc = nccl_ready(x, err, errlen);
  if (rc != 0 || (rc = use_device(x, proc_device(x), err, errlen)) != 0) return fail_watch(watch, rc);
  if (find_comm(cid) != NULL) {
    snprintf(err, errlen, "__gpu_nccl_init: communicator %llu already exists on this proc", (unsigned long long)cid);
    return fail_watch(watch, MN_EINVAL);
  }
  if (G.ncomms == MN_GPU_MAX_COMMS) {
    snprintf(err, errlen, "__gpu_nccl_init: MN_GPU_MAX_COMMS (%d) communicators already live on this proc",
             MN_GPU_MAX_COMMS);
    return fail_watch(watch, MN_ELIMIT);
  }
  memcpy(id.internal, s, sizeof(id.internal));
  void *comm = NULL;
  rc = G.nccl.CommInitRank(&comm, (int)nranks, id, (int)rank);
  if (rc != NCCL_SUCCESS) return fail_watch(watch, nccl_fail(x, rc, NULL, "ncclCommInitRank", err, errlen));
  G.comms[G.ncomms++] = (comm_t){cid, comm, (int)nranks, (int)rank, G.cur, watch};
  return 0;
}

/* __gpu_nccl_free(comm) -> true, or false if there was none */
static int b_nccl_free(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                       size_t errlen) {
  uint64_t cid;
  if (mn_get_u64(args, 0, &cid) != 0) {
    snprintf(err, errlen, "__gpu_nccl_free takes a communicator id");
    return MN_EINVAL;
  }
  comm_t *c = find_comm(cid);
  if (c == NULL) return mn_exec_returned(x, mk_return_bool(ctx, 0));
  int rc = G.nccl.CommDestroy(c->comm);
  drop_comm(c);
  if (rc != NCCL_SUCCESS) return nccl_fail(x, rc, NULL, "ncclCommDestroy", err, errlen);
  return mn_exec_returned(x, mk_return_bool(ctx, 1));
}

/* Checks a collective's tensor against its communicator; 0 or MN_EINVAL with err. */
static int coll_tensor(const comm_t *c, const mk_tensor_t *t, const char *who, char *err, size_t errlen) {
  if (t->device != c->device) {
    snprintf(err, errlen, "%s: tensor %llu is on cuda:%d but communicator %llu is on cuda:%d", who,
             (unsigned long long)t->id, t->device, (unsigned long long)c->id, c->device);
    return MN_EINVAL;
  }
  if (nccl_dtype(t->dtype) < 0) {
    snprintf(err, errlen, "%s: dtype %s has no NCCL type", who, mn_dtype_name(t->dtype));
    return MN_EINVAL;
  }
  return 0;
}

/* __gpu_all_reduce(comm, t, op), __gpu_broadcast(comm, t, root),
 * __gpu_all_gather(comm, send, recv), __gpu_reduce_scatter(comm, send, recv, op). */
typedef enum { GPU_ALL_REDUCE, GPU_BROADCAST, GPU_ALL_GATHER, GPU_REDUCE_SCATTER } gpu_coll_t;

/*
 * Enqueues one NCCL collective on `stream` over checked tensors (a: the
 * tensor or the send side, b: the receive side of a gather or scatter) and
 * waits for it with coll_wait. arg is NCCL's reduction op, or the root.
 */
static int launch(mn_exec_t *x, mk_ctx_t *ctx, gpu_coll_t kind, comm_t *c, mk_tensor_t *a, mk_tensor_t *b, int arg,
                  void *stream, const char *who, char *err, size_t errlen) {
  int rc, dt = nccl_dtype(a->dtype);
  if (kind == GPU_ALL_REDUCE) rc = G.nccl.AllReduce(a->data, a->data, (size_t)a->numel, dt, arg, c->comm, stream);
  else if (kind == GPU_BROADCAST) rc = G.nccl.Broadcast(a->data, a->data, (size_t)a->numel, dt, arg, c->comm, stream);
  else if (kind == GPU_ALL_GATHER) rc = G.nccl.AllGather(a->data, b->data, (size_t)a->numel, dt, c->comm, stream);
  else rc = G.nccl.ReduceScatter(a->data, b->data, (size_t)b->numel, dt, arg, c->comm, stream);
  if (rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS) return nccl_fail(x, rc, c->comm, who, err, errlen);
  return coll_wait(x, ctx, c, stream, who, err, errlen);
}

static int b_collective(mn_exec_t *x, mk_ctx_t *ctx, gpu_coll_t kind, const char *who, const msgpack_object *args,
                        char *err, size_t errlen) {
  int is_ar = kind == GPU_ALL_REDUCE, is_bc = kind == GPU_BROADCAST;
  int is_ag = kind == GPU_ALL_GATHER, is_rs = kind == GPU_REDUCE_SCATTER;
  int op = 0, root = 0, rc;
  int64_t r64;
  comm_t *c = comm_arg(x, args, who, err, errlen);
  if (c == NULL) return MN_EINVAL; /* also when NCCL is missing: x->err_kind says "no_gpu" */
  mk_tensor_t *a = gpu_tensor_arg(x, args, 1, who, err, errlen), *b = a;
  if (a == NULL || coll_tensor(c, a, who, err, errlen) != 0) return MN_EINVAL;
  if (is_ag || is_rs) {
    b = gpu_tensor_arg(x, args, 2, who, err, errlen);
    if (b == NULL || coll_tensor(c, b, who, err, errlen) != 0) return MN_EINVAL;
    /* The gathered (or scattered-from) side holds one part per rank. */
    const mk_tensor_t *part = is_ag ? a : b, *whole = is_ag ? b : a;
    if (a == b || a->dtype != b->dtype || whole->numel != part->numel * c->nranks) {
      snprintf(err, errlen, "%s: %s must be a separate %s tensor of %d x %lld elements (%d ranks), got %s of %lld",
               who, is_ag ? "recv" : "send", mn_dtype_name(part->dtype), c->nranks, (long long)part->numel,
               c->nranks, mn_dtype_name(whole->dtype), (long long)whole->numel);
      return MN_EINVAL;
    }
  }
  if ((is_ar || is_rs) && (op = nccl_op(args, is_ar ? 2 : 3, who, err, errlen)) < 0) return op;
  if (is_bc) {
    if (mn_get_i64(args, 2, &r64) != 0 || r64 < 0 || r64 >= c->nranks) {
      snprintf(err, errlen, "%s: argument 3 must be the root rank, 0..%d", who, c->nranks - 1);
      return MN_EINVAL;
    }
    root = (int)r64;
  }
  if ((rc = use_device(x, c->device, err, errlen)) != 0) return rc;
  return launch(x, ctx, kind, c, a, b, is_bc ? root : op, NULL, who, err, errlen);
}

static int b_all_reduce(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                        size_t errlen) {
  return b_collective(x, ctx, GPU_ALL_REDUCE, b->name, args, err, errlen);
}
static int b_broadcast(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                       size_t errlen) {
  return b_collective(x, ctx, GPU_BROADCAST, b->name, args, err, errlen);
}
static int b_all_gather(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                        size_t errlen) {
  return b_collective(x, ctx, GPU_ALL_GATHER, b->name, args, err, errlen);
}
static int b_reduce_scatter(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                            size_t errlen) {
  return b_collective(x, ctx, GPU_REDUCE_SCATTER, b->name, args, err, errlen);
}

/* ---- collectives kernels call (exec.h's GPU hooks) ----------------------------- */

static int k_has(uint64_t gid) { return find_comm(gid) != NULL; }

static void k_drop(uint64_t gid) {
  comm_t *c = find_comm(gid);
  if (c == NULL) return;
  if (G.nccl.CommAbort(c->comm) != NCCL_SUCCESS)
    fprintf(stderr, "monarch proc: ncclCommAbort of communicator %llu failed\n", (unsigned long long)gid);
  drop_comm(c);
}

/* NCCL's reduction for an mk_reduce_op_t, or MN_EINVAL with err. */
static int kernel_op(int op, const char *who, char *err, size_t errlen) {
  static const int nccl_ops[] = {0, 2, 3, 4}; /* MK_SUM, MK_MAX, MK_MIN, MK_AVG -> ncclSum, ncclMax, ncclMin, ncclAvg */
  if (op >= 0 && op < 4) return nccl_ops[op];
  snprintf(err, errlen, "%s: unknown reduction %d (MK_SUM, MK_MAX, MK_MIN, MK_AVG)", who, op);
  return MN_EINVAL;
}

/* Checks an in-kernel GPU collective's arguments against its communicator; 0 or MN_EINVAL with err. */
static int kernel_args(const comm_t *c, const mn_kcoll_t *k, const char *who, char *err, size_t errlen) {
  const mk_tensor_t *part = k->what == MN_KCOLL_ALL_GATHER ? k->t : k->dst;
  const mk_tensor_t *whole = k->what == MN_KCOLL_ALL_GATHER ? k->dst : k->t;
  if (coll_tensor(c, k->t, who, err, errlen) != 0 || (k->dst != NULL && coll_tensor(c, k->dst, who, err, errlen) != 0))
    return MN_EINVAL;
  if (k->what == MN_KCOLL_BROADCAST && (k->arg < 0 || k->arg >= c->nranks)) {
    snprintf(err, errlen, "%s: root %d is outside the group's positions 0..%d", who, k->arg, c->nranks - 1);
    return MN_EINVAL;
  }
  if (k->dst != NULL && (k->t->data == k->dst->data || k->t->dtype != k->dst->dtype ||
                         whole->numel != part->numel * c->nranks)) {
    snprintf(err, errlen, "%s: %s must be a separate %s tensor of %d x %lld elements (%d members), got %s of %lld", who,
             k->what == MN_KCOLL_ALL_GATHER ? "dst" : "src", mn_dtype_name(part->dtype), c->nranks,
             (long long)part->numel, c->nranks, mn_dtype_name(whole->dtype), (long long)whole->numel);
    return MN_EINVAL;
  }
  return 0;
}

/*
 * Runs an in-kernel collective of group k->gid through the NCCL
 * communicator of the same id, on ctx->stream, and waits for it as the
 * built-ins do (a dead member, a cancel or the timeout aborts it); a
 * barrier only waits for the stream to drain. exec_coll.c has checked that
 * every member makes the same call. Any failure drops the communicator.
 */
static int k_run(mn_exec_t *x, mk_ctx_t *ctx, const mn_kcoll_t *k, char *err, size_t errlen) {
  static const char *const names[] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier"};
  static const gpu_coll_t kinds[] = {GPU_ALL_REDUCE, GPU_BROADCAST, GPU_ALL_GATHER, GPU_REDUCE_SCATTER};
  const char *who = k->what <= MN_KCOLL_BARRIER ? names[k->what] : "collective";
  comm_t *c = find_comm(k->gid);
  int rc, arg = k->arg;
  if (c == NULL || k->what > MN_KCOLL_BARRIER) {
    snprintf(err, errlen, "%s: group %llu has no NCCL communicator on this proc", who, (unsigned long long)k->gid);
    return MN_ENOTFOUND;
  }
  if ((rc = use_device(x, c->device, err, errlen)) != 0) return rc;
  if (k->what == MN_KCOLL_BARRIER) {
    int q = G.rt.StreamQuery(ctx->stream);
    return q == CUDA_SUCCESS ? 0 : coll_wait(x, ctx, c, ctx->stream, who, err, errlen);
  }
  if ((rc = kernel_args(c, k, who, err, errlen)) != 0) return rc;
  if ((k->what == MN_KCOLL_ALL_REDUCE || k->what == MN_KCOLL_REDUCE_SCATTER) &&
      (arg = kernel_op(k->arg, who, err, errlen)) < 0)
    return arg;
  return launch(x, ctx, kinds[k->what], c, k->t, k->dst, arg, ctx->stream, who, err, errlen);
}

static const mn_exec_gpu_coll_t kernel_colls = {k_has, k_run, k_drop};

/* gpu.h documents each one. */
static const mn_builtin_t entries[] = {
  {"__gpu_info", b_info, "()"},
  {"__gpu_tensor_new", b_tensor_new, "(id, dtype, shape, device?)"},
  {"__gpu_fetch", b_fetch, "(tensor)"},
  {"__gpu_put", b_put, "(tensor, bytes)"},
  {"__gpu_free", b_free, "(tensor)"},
  {"__gpu_sync", b_sync, "()"},
  {"__gpu_nccl_id", b_nccl_id, "()"},
  {"__gpu_nccl_init", b_nccl_init, "(comm, id bytes, nranks, rank [, watch group])"},
  {"__gpu_nccl_free", b_nccl_free, "(comm)"},
  {"__gpu_all_reduce", b_all_reduce, "(comm, tensor, op)"},
  {"__gpu_broadcast", b_broadcast, "(comm, tensor, root)"},
  {"__gpu_all_gather", b_all_gather, "(comm, send, recv)"},
  {"__gpu_reduce_scatter", b_reduce_scatter, "(comm, send, recv, op)"},
};

#define MN_GPU_MAX_SHOWN 63 /* most bytes of an unknown name the message repeats */
static void gpu_unknown(const mn_builtin_module_t *m, const char *name, size_t nl, char *err, size_t errlen) {
  snprintf(err, errlen, "unknown GPU built-in '%.*s'", (int)(nl < MN_GPU_MAX_SHOWN ? nl : MN_GPU_MAX_SHOWN), name);
}

static const mn_builtin_module_t module = {"__gpu_", entries, (int)(sizeof(entries) / sizeof(entries[0])),
                                           gpu_unknown};

/* ---- registration ----------------------------------------------------------- */

int mn_gpu_register(void) {
  static int registered;
  if (registered) return 0;
  int rc = mn_exec_register(&module);
  if (rc != 0) return rc;
#ifdef MN_DEVICE_HOOKS
  mn_registry_set_device_ops(&device_ops);
#endif
  mn_exec_set_gpu_coll(&kernel_colls);
  registered = 1;
  return 0;
}

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
  for (int i = 0; i < G.ncomms; i++)
    if (G.nccl.CommAbort(G.comms[i].comm) != NCCL_SUCCESS) fprintf(stderr, "monarch proc: ncclCommAbort failed\n");
  /* Libraries stay mapped: unloading the CUDA runtime mid-process is not safe. */
  memset(&G, 0, sizeof(G));
  G.cur = -1;
  G.fake_rt = rt;
  G.fake_nccl = nccl;
}
