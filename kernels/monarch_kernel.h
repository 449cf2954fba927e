/*
 * monarch_kernel.h - the whole ABI a kernel author needs.
 *
 * A kernel is a plain C function:
 *
 *     int my_kernel(mk_ctx_t *ctx, int argc, const mk_arg_t *argv);
 *
 * It reads typed argument views, writes results with the mk_return_* helpers
 * and returns 0, or returns mk_error(ctx, "fmt", ...) on failure. A library
 * exports one function, monarch_kernels(), that returns its table. The host
 * checks every call against the kernel's signature before running it, so a
 * kernel never sees an argument of the wrong type or count.
 *
 * Libraries link against nothing from the host: every service is reached
 * through ctx->api, so a kernel .so loads into any version of the proc that
 * speaks the same MK_ABI_VERSION.
 */
#ifndef MONARCH_KERNEL_H
#define MONARCH_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * 2 added the collectives at the end of mk_api_t (and MK_ARG_GROUP). A proc
 * accepts libraries of versions MK_ABI_VERSION_MIN..MK_ABI_VERSION, so one
 * built against version 1 loads unchanged; a proc that predates version 2
 * refuses a version-2 library instead of letting it call past the end of
 * its shorter api struct.
 */
#define MK_ABI_VERSION 2
#define MK_ABI_VERSION_MIN 1
#define MK_MAX_DIMS 8 /* most dimensions a tensor may have */

typedef enum {
  MK_F32 = 0,
  MK_F64 = 1,
  MK_F16 = 2, /* storage only */
  MK_BF16 = 3, /* storage only */
  MK_I32 = 4,
  MK_I64 = 5,
  MK_U8 = 6,
  MK_DTYPE_COUNT
} mk_dtype_t;

typedef enum {
  MK_ARG_NIL = 0,
  MK_ARG_BOOL,
  MK_ARG_INT,    /* v.i */
  MK_ARG_NUMBER, /* v.num */
  MK_ARG_STRING, /* v.str: not NUL-terminated, use len */
  MK_ARG_BYTES,  /* v.str */
  MK_ARG_TENSOR, /* v.tensor */
  MK_ARG_GROUP   /* v.group (ABI 2): a signature letter 'g' */
} mk_arg_type_t;

/* Reductions of mk_all_reduce and mk_reduce_scatter. MK_AVG truncates integers toward zero. */
typedef enum { MK_SUM = 0, MK_MAX = 1, MK_MIN = 2, MK_AVG = 3 } mk_reduce_op_t;

typedef struct mk_tensor_s {
  void *data;                  /* host memory, or device memory when device >= 0 */
  mk_dtype_t dtype;
  int ndim;
  int64_t shape[MK_MAX_DIMS];
  int64_t numel;
  size_t nbytes;
  int device;                  /* -1: CPU; otherwise CUDA device ordinal */
  uint64_t id;                 /* handle the controller knows it by */
} mk_tensor_t;

/*
 * A group of procs this kernel may run collectives on (ABI 2): the script
 * made it with mesh:group() and passed it for a 'g' argument. Every member
 * of the group runs the same kernel call; valid until the kernel returns.
 */
typedef struct mk_group_s {
  uint64_t id; /* the group's id, the same on every member */
  int rank;    /* this proc's position in the group, 0..size-1 */
  int size;    /* members of the group */
} mk_group_t;

typedef struct {
  mk_arg_type_t type;
  union {
    int b;
    int64_t i;
    double num;
    struct {
      const char *ptr;
      size_t len;
    } str;
    mk_tensor_t *tensor;
    const mk_group_t *group;
  } v;
} mk_arg_t;

typedef struct mk_ctx_s mk_ctx_t;

/* Services the proc gives kernels. Reached through the inline helpers below. */
typedef struct {
  int (*ret_nil)(mk_ctx_t *ctx);
  int (*ret_bool)(mk_ctx_t *ctx, int b);
  int (*ret_int)(mk_ctx_t *ctx, int64_t i);
  int (*ret_number)(mk_ctx_t *ctx, double d);
  int (*ret_string)(mk_ctx_t *ctx, const char *s, size_t len);
  int (*ret_bytes)(mk_ctx_t *ctx, const void *p, size_t len);
  /* Sets the error message; returns -1 so `return ctx->api->error(...)` reads well. */
  int (*error)(mk_ctx_t *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
  /* Scratch memory valid until the kernel returns; NULL if it cannot be had. */
  void *(*scratch)(mk_ctx_t *ctx, size_t nbytes);
  /* Nonzero once the controller has asked this call to stop (long kernels poll it). */
  int (*cancelled)(mk_ctx_t *ctx);
  /*
   * ABI 2: collectives on a group, run by every member in the same order
   * (docs/kernels.md). Each returns 0, or a negative code (MK_COLL_E*) with
   * the call's error message already set (return the code as it is, or
   * replace the message with mk_errorf). After a failure the group is gone
   * on every member and the call fails whatever the kernel returns.
   */
  int (*all_reduce)(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int op);
  int (*broadcast)(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int root);
  int (*all_gather)(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *src, mk_tensor_t *dst);
  int (*reduce_scatter)(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *src, mk_tensor_t *dst, int op);
  int (*barrier)(mk_ctx_t *ctx, const mk_group_t *g);
} mk_api_t;

/* What the collectives return on failure: the proc's own codes (err.h), named for kernels; others may come too. */
#define MK_COLL_ETIMEDOUT (-1010) /* a member sent or took nothing for the timeout */
#define MK_COLL_EINVAL (-1011)    /* bad arguments on this member (the others are told why) */
#define MK_COLL_ENOTFOUND (-1012) /* the group is gone (a failed collective tore it down) */
#define MK_COLL_EPEER (-1013)     /* a member died, gave up, or called something else */
#define MK_COLL_ECANCELED (-1014) /* the call was cancelled */
#define MK_COLL_EDEVICE (-1016)   /* a tensor on the wrong device for the group (GPU groups: mesh:group{gpu = true}), or CUDA/NCCL failed */

struct mk_ctx_s {
  const mk_api_t *api;
  int rank;          /* this proc's rank in its world */
  int world;         /* number of procs spawned with it */
  int device;        /* CUDA device ordinal, -1 on a CPU proc */
  void *stream;      /* cudaStream_t on a GPU proc, NULL otherwise */
  const char *kernel; /* name of the running kernel */
  void *host;        /* private to the proc */
};

typedef int (*mk_fn_t)(mk_ctx_t *ctx, int argc, const mk_arg_t *argv);

/*
 * Signature string, one letter per argument, checked before the call:
 *   n number (int or float)   i integer (int, or a float with integral value)
 *   s string                  b bytes (string or bin)
 *   t tensor                  B boolean
 *   a any value               g group (ABI 2; arrives as MK_ARG_GROUP)
 * The host converts per signature: an 'n' argument always arrives as
 * MK_ARG_NUMBER and an 'i' argument as MK_ARG_INT, a 'b' as MK_ARG_BYTES.
 * A trailing '*' accepts any number of further arguments of any type, and
 * a '?' after a letter makes that argument (and all after it) optional.
 */
typedef struct {
  const char *name;
  mk_fn_t fn;
  const char *signature;
  const char *doc;
} mk_kernel_t;

typedef struct {
  int abi_version; /* MK_ABI_VERSION the library was built against */
  const char *name;
  int count;
  const mk_kernel_t *kernels;
} mk_library_t;

/* The one symbol a kernel library exports. */
#define MK_LIBRARY_SYMBOL "monarch_kernels"
typedef const mk_library_t *(*mk_library_fn_t)(void);

static inline int mk_error(mk_ctx_t *ctx, const char *msg) { return ctx->api->error(ctx, "%s", msg); }
#define mk_errorf(ctx, ...) ((ctx)->api->error((ctx), __VA_ARGS__))
static inline int mk_return_nil(mk_ctx_t *ctx) { return ctx->api->ret_nil(ctx); }
static inline int mk_return_bool(mk_ctx_t *ctx, int b) { return ctx->api->ret_bool(ctx, b); }
static inline int mk_return_int(mk_ctx_t *ctx, int64_t i) { return ctx->api->ret_int(ctx, i); }
static inline int mk_return_number(mk_ctx_t *ctx, double d) { return ctx->api->ret_number(ctx, d); }
static inline int mk_return_string(mk_ctx_t *ctx, const char *s, size_t n) { return ctx->api->ret_string(ctx, s, n); }
static inline int mk_return_bytes(mk_ctx_t *ctx, const void *p, size_t n) { return ctx->api->ret_bytes(ctx, p, n); }
static inline void *mk_scratch(mk_ctx_t *ctx, size_t n) { return ctx->api->scratch(ctx, n); }
static inline int mk_cancelled(mk_ctx_t *ctx) { return ctx->api->cancelled(ctx); }
static inline int mk_all_reduce(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, mk_reduce_op_t op) {
  return ctx->api->all_reduce(ctx, g, t, (int)op);
}
static inline int mk_broadcast(mk_ctx_t *ctx, const mk_group_t *g, mk_tensor_t *t, int root) {
  return ctx->api->broadcast(ctx, g, t, root);
}
static inline int mk_all_gather(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *src, mk_tensor_t *dst) {
  return ctx->api->all_gather(ctx, g, src, dst);
}
static inline int mk_reduce_scatter(mk_ctx_t *ctx, const mk_group_t *g, const mk_tensor_t *src, mk_tensor_t *dst,
                                    mk_reduce_op_t op) {
  return ctx->api->reduce_scatter(ctx, g, src, dst, (int)op);
}
static inline int mk_barrier(mk_ctx_t *ctx, const mk_group_t *g) { return ctx->api->barrier(ctx, g); }

static inline size_t mk_dtype_size(mk_dtype_t d) {
  switch (d) {
  case MK_F32: case MK_I32: return 4;
  case MK_F64: case MK_I64: return 8;
  case MK_F16: case MK_BF16: return 2;
  case MK_U8: return 1;
  default: return 0;
  }
}

/* The name scripts give an element type ("f32", as in tensor.lua and the signatures), or "unknown" for a
 * value outside the ABI: the one table of names, for kernels' messages and the host alike. */
static inline const char *mk_dtype_name(mk_dtype_t d) {
  switch (d) {
  case MK_F32: return "f32";
  case MK_F64: return "f64";
  case MK_F16: return "f16";
  case MK_BF16: return "bf16";
  case MK_I32: return "i32";
  case MK_I64: return "i64";
  case MK_U8: return "u8";
  default: return "unknown";
  }
}

/* Reads a numeric argument as double whether it arrived as int or float. */
static inline double mk_arg_number(const mk_arg_t *a) {
  return a->type == MK_ARG_INT ? (double)a->v.i : a->v.num;
}

#define MK_EXPORT __attribute__((visibility("default")))

#ifdef __cplusplus
}
#endif
#endif /* MONARCH_KERNEL_H */
