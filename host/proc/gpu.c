/*
 * gpu.c - the proc's GPU module: CUDA device memory for tensors (the
 * registry's device hooks) and the __gpu_ built-ins on it, and the table
 * of every __gpu_ built-in (those on communicators are in gpu_comm.c);
 * see gpu.h.
 */
#include "gpu_int.h"

#include "registry.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MN_GPU_PROPS_BYTES 16384   /* room for any CUDA version's cudaDeviceProp */
#define MN_GPU_MIN_ALLOC 256       /* bytes allocated for an empty tensor */

static int alloc_failed; /* the last device allocation failed (error kind "gpu"); set before each */

static mn__gpu_t *const G = &mn__gpu; /* what gpu_load.c loaded */

/* ---- device memory for the registry ----------------------------------------- */

#ifdef MN_DEVICE_HOOKS
static void *dev_alloc(int device, size_t nbytes, char *err, size_t errlen) {
  void *p = NULL;
  size_t n = nbytes < MN_GPU_MIN_ALLOC ? MN_GPU_MIN_ALLOC : nbytes;
  if (mn__gpu_use_device(NULL, device, err, errlen) != 0) return NULL;
  int rc = G->rt.Malloc(&p, n);
  alloc_failed = rc != CUDA_SUCCESS;
  if (rc != CUDA_SUCCESS) {
    snprintf(err, errlen, "cudaMalloc of %zu bytes on cuda:%d failed: %s", nbytes, device, G->rt.GetErrorString(rc));
    return NULL;
  }
  rc = G->rt.Memset(p, 0, n);
  if (rc != CUDA_SUCCESS) {
    alloc_failed = 1;
    snprintf(err, errlen, "cudaMemset of %zu bytes on cuda:%d failed: %s", nbytes, device, G->rt.GetErrorString(rc));
    if (G->rt.Free(p) != CUDA_SUCCESS) fprintf(stderr, "monarch proc: cudaFree after a failed cudaMemset failed\n");
    return NULL;
  }
  return p;
}

static void dev_release(int device, void *p) {
  char err[256];
  /* A failure here leaks device memory but must not take the proc down. */
  if (mn__gpu_use_device(NULL, device, err, sizeof(err)) != 0) {
    fprintf(stderr, "monarch proc: cannot free device memory: %s\n", err);
    return;
  }
  int rc = G->rt.Free(p);
  if (rc != CUDA_SUCCESS)
    fprintf(stderr, "monarch proc: cudaFree on cuda:%d failed: %s\n", device, G->rt.GetErrorString(rc));
}

static const mn_device_ops_t device_ops = {dev_alloc, dev_release};

int mn__gpu_proc_device(const mn_exec_t *x) { return x->device >= 0 ? x->device : 0; }
#else
int mn__gpu_proc_device(const mn_exec_t *x) { return 0; }
#endif

/* ---- arguments --------------------------------------------------------------- */

static const msgpack_object *arg(const msgpack_object *args, uint32_t i) {
  return i < args->via.array.size ? &args->via.array.ptr[i] : NULL;
}

/* A GPU tensor argument; NULL with err if absent or on the CPU. */
mk_tensor_t *mn__gpu_tensor_arg(mn_exec_t *x, const msgpack_object *args, uint32_t i, const char *who,
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

/* ---- built-ins --------------------------------------------------------------- */

/* __gpu_info() */
static int b_info(mn_exec_t *x, mk_ctx_t *ctx, const mn_builtin_t *b, const msgpack_object *args, char *err,
                  size_t errlen) {
  int dev = mn__gpu_proc_device(x), major = 0, minor = 0, rtv = 0, drv = 0, rc;
  size_t fb = 0, tb = 0;
  char *props, cc[32];
  if ((rc = mn__gpu_use_device(x, dev, err, errlen)) != 0) return rc;
  if ((rc = G->rt.MemGetInfo(&fb, &tb)) != CUDA_SUCCESS) return mn__gpu_cuda_fail(x, rc, "cudaMemGetInfo", err, errlen);
  if ((rc = G->rt.DeviceGetAttribute(&major, CUDA_ATTR_CC_MAJOR, dev)) != CUDA_SUCCESS ||
      (rc = G->rt.DeviceGetAttribute(&minor, CUDA_ATTR_CC_MINOR, dev)) != CUDA_SUCCESS)
    return mn__gpu_cuda_fail(x, rc, "cudaDeviceGetAttribute", err, errlen);
  if ((rc = G->rt.RuntimeGetVersion(&rtv)) != CUDA_SUCCESS || (rc = G->rt.DriverGetVersion(&drv)) != CUDA_SUCCESS)
    return mn__gpu_cuda_fail(x, rc, "cudaRuntimeGetVersion", err, errlen);
  props = calloc(1, MN_GPU_PROPS_BYTES);
  if (props == NULL) {
    snprintf(err, errlen, "__gpu_info: out of memory");
    return MN_ENOMEM;
  }
  rc = G->rt.GetDeviceProperties(props, dev);
  if (rc != CUDA_SUCCESS) {
    free(props);
    return mn__gpu_cuda_fail(x, rc, "cudaGetDeviceProperties", err, errlen);
  }
  props[255] = '\0'; /* cudaDeviceProp starts with char name[256] in every version */
  snprintf(cc, sizeof(cc), "%d.%d", major, minor);
  int bad = mk_return_int(ctx, G->ndev) || mk_return_string(ctx, props, strlen(props)) ||
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
  if (dev < 0) dev = mn__gpu_proc_device(x);
  if (dev > INT_MAX) dev = INT_MAX; /* use_device names the valid range */
  rc = mn__gpu_use_device(x, (int)dev, err, errlen);
  if (rc != 0) return rc;
#ifdef MN_DEVICE_HOOKS
  alloc_failed = 0;
  if (mn_tensor_new_on(&x->reg, id, (mk_dtype_t)dt, (int)sh->via.array.size, shape, (int)dev, err, errlen) != NULL)
    return 0;
  if (alloc_failed) x->err_kind = "gpu";
  return alloc_failed ? MN_EDEVICE : MN_EINVAL;
#else
  snprintf(err, errlen, "GPU tensors need the registry's device hooks (MN_DEVICE_HOOKS), which this proc lacks");
  return MN_EINVAL;
#endif
}

/* The GPU tensor that __gpu_fetch and __gpu_put copy, on a ready device; NULL with err (and x->err_kind). */
static mk_tensor_t *copy_tensor(mn_exec_t *x, const mn_builtin_t *b, const msgpack_object *args, char *err,
                                size_t errlen) {
  if (mn__gpu_cuda_ready(x, err, errlen) != 0) return NULL;
  mk_tensor_t *t = mn__gpu_tensor_arg(x, args, 0, b->name, err, errlen);
  if (t == NULL || mn__gpu_use_device(x, t->device, err, errlen) != 0) return NULL;
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
  int rc = G->rt.Memcpy(host, t->data, t->nbytes, CUDA_D2H);
  if (rc != CUDA_SUCCESS) {
    free(host);
    return mn__gpu_cuda_fail(x, rc, "__gpu_fetch: cudaMemcpy device to host", err, errlen);
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
  int rc = G->rt.Memcpy(t->data, s, sl, CUDA_H2D);
  return rc == CUDA_SUCCESS ? 0 : mn__gpu_cuda_fail(x, rc, "__gpu_put: cudaMemcpy host to device", err, errlen);
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
  int rc = mn__gpu_use_device(x, mn__gpu_proc_device(x), err, errlen);
  if (rc != 0) return rc;
  rc = G->rt.DeviceSynchronize();
  return rc == CUDA_SUCCESS ? 0 : mn__gpu_cuda_fail(x, rc, "cudaDeviceSynchronize", err, errlen);
}

/* ---- the module ------------------------------------------------------------- */

/* gpu.h documents each one. */
static const mn_builtin_t entries[] = {
  {"__gpu_info", b_info, "()"},
  {"__gpu_tensor_new", b_tensor_new, "(id, dtype, shape, device?)"},
  {"__gpu_fetch", b_fetch, "(tensor)"},
  {"__gpu_put", b_put, "(tensor, bytes)"},
  {"__gpu_free", b_free, "(tensor)"},
  {"__gpu_sync", b_sync, "()"},
  {"__gpu_nccl_id", mn__gpu_b_nccl_id, "()"},
  {"__gpu_nccl_init", mn__gpu_b_nccl_init, "(comm, id bytes, nranks, rank [, watch group])"},
  {"__gpu_nccl_free", mn__gpu_b_nccl_free, "(comm)"},
  {"__gpu_all_reduce", mn__gpu_b_all_reduce, "(comm, tensor, op)"},
  {"__gpu_broadcast", mn__gpu_b_broadcast, "(comm, tensor, root)"},
  {"__gpu_all_gather", mn__gpu_b_all_gather, "(comm, send, recv)"},
  {"__gpu_reduce_scatter", mn__gpu_b_reduce_scatter, "(comm, send, recv, op)"},
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
  mn_exec_set_gpu_coll(&mn__gpu_kernel_colls);
  registered = 1;
  return 0;
}

