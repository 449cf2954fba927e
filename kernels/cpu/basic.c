/*
 * basic.c - the built-in CPU kernel library "basic".
 *
 * Small, dependable kernels for smoke tests, examples and benchmarks: fills,
 * reductions, BLAS-1 style updates and one BLAS-3 call (sgemm via OpenBLAS).
 * Every error message starts with the kernel name so that the controller can
 * show it without further context.
 */
#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "monarch_kernel.h"

/* Room for "bf16[" + MK_MAX_DIMS 20-digit dims with separators + "]". */
#define SHAPE_BUF 200

/* Writes "3x4" (or "" for a 0-d tensor) into buf. */
static const char *dims_str(const int64_t *shape, int ndim, char *buf, size_t n) {
  size_t off = 0;
  buf[0] = '\0';
  for (int i = 0; i < ndim && off < n; i++) {
    int w = snprintf(buf + off, n - off, i ? "x%lld" : "%lld", (long long)shape[i]);
    if (w < 0)
      break;
    off += (size_t)w;
  }
  return buf;
}

/* Writes "f32[3x4]": error messages that compare two tensors need both. */
static const char *desc(const mk_tensor_t *t, char *buf, size_t n) {
  char dims[SHAPE_BUF];
  snprintf(buf, n, "%s[%s]", mk_dtype_name(t->dtype),
           dims_str(t->shape, t->ndim < MK_MAX_DIMS ? t->ndim : MK_MAX_DIMS, dims, sizeof(dims)));
  return buf;
}

static int check_cpu(mk_ctx_t *ctx, const char *k, const mk_tensor_t *t) {
  if (t->device >= 0)
    return mk_errorf(ctx, "%s: basic is a CPU library; tensor is on cuda:%d", k, t->device);
  return 0;
}

static int bad_dtype(mk_ctx_t *ctx, const char *k, const mk_tensor_t *t, const char *supported) {
  return mk_errorf(ctx, "%s: unsupported dtype %s (supported: %s)", k, mk_dtype_name(t->dtype),
                   supported);
}

#define ALL_DTYPES "f32, f64, i32, i64, u8"
#define FLOAT_DTYPES "f32, f64"

static int is_int_dtype(mk_dtype_t d) {
  return d == MK_I32 || d == MK_I64 || d == MK_U8;
}

/*
 * Integer tensors accept only values they can hold exactly: silently wrapping
 * or truncating 300 into a u8 would hide the caller's bug.
 */
static int to_int(mk_ctx_t *ctx, const char *k, mk_dtype_t d, double v, int64_t *out) {
  double lo, hi; /* hi is exclusive so that 2^63 needs no rounding */
  switch (d) {
  case MK_I32: lo = INT32_MIN; hi = 2147483648.0; break;
  case MK_U8: lo = 0; hi = 256.0; break;
  default: lo = -9223372036854775808.0; hi = 9223372036854775808.0; break;
  }
  if (!(v >= lo && v < hi) || v != floor(v))
    return mk_errorf(ctx, "%s: value %.17g does not fit in %s", k, v, mk_dtype_name(d));
  *out = (int64_t)v;
  return 0;
}

static int int_max_ok(mk_dtype_t d, int64_t v) {
  switch (d) {
  case MK_I32: return v <= INT32_MAX;
  case MK_U8: return v <= UINT8_MAX;
  default: return 1;
  }
}

/* noop: the cheapest possible call, for measuring dispatch overhead. */
static int k_noop(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)ctx, (void)argc, (void)argv;
  return 0;
}

static int k_echo(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  for (int i = 0; i < argc; i++) {
    const mk_arg_t *a = &argv[i];
    int rc;
    switch (a->type) {
    case MK_ARG_NIL: rc = mk_return_nil(ctx); break;
    case MK_ARG_BOOL: rc = mk_return_bool(ctx, a->v.b); break;
    case MK_ARG_INT: rc = mk_return_int(ctx, a->v.i); break;
    case MK_ARG_NUMBER: rc = mk_return_number(ctx, a->v.num); break;
    case MK_ARG_STRING: rc = mk_return_string(ctx, a->v.str.ptr, a->v.str.len); break;
    case MK_ARG_BYTES: rc = mk_return_bytes(ctx, a->v.str.ptr, a->v.str.len); break;
    /* A tensor cannot travel back by value; its id is what the controller knows. */
    case MK_ARG_TENSOR: rc = mk_return_int(ctx, (int64_t)a->v.tensor->id); break;
    default: return mk_errorf(ctx, "echo: argument %d has unknown type %d", i + 1, (int)a->type);
    }
    if (rc != 0)
      return rc;
  }
  return 0;
}

static int k_rank(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc, (void)argv;
  int rc = mk_return_int(ctx, ctx->rank);
  return rc != 0 ? rc : mk_return_int(ctx, ctx->world);
}

static int k_fill(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  mk_tensor_t *t = argv[0].v.tensor;
  double v = mk_arg_number(&argv[1]);
  int64_t iv = 0;
  if (check_cpu(ctx, "fill", t))
    return -1;
  if (is_int_dtype(t->dtype) && to_int(ctx, "fill", t->dtype, v, &iv))
    return -1;
  int64_t n = t->numel;
  switch (t->dtype) {
  case MK_F32: { float *p = t->data; for (int64_t i = 0; i < n; i++) p[i] = (float)v; break; }
  case MK_F64: { double *p = t->data; for (int64_t i = 0; i < n; i++) p[i] = v; break; }
  case MK_I32: { int32_t *p = t->data; for (int64_t i = 0; i < n; i++) p[i] = (int32_t)iv; break; }
  case MK_I64: { int64_t *p = t->data; for (int64_t i = 0; i < n; i++) p[i] = iv; break; }
  case MK_U8: { uint8_t *p = t->data; for (int64_t i = 0; i < n; i++) p[i] = (uint8_t)iv; break; }
  default: return bad_dtype(ctx, "fill", t, ALL_DTYPES);
  }
  return 0;
}

static int k_iota(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  mk_tensor_t *t = argv[0].v.tensor;
  double start = argc > 1 ? mk_arg_number(&argv[1]) : 0.0;
  int64_t is = 0, n = t->numel;
  if (check_cpu(ctx, "iota", t))
    return -1;
  if (is_int_dtype(t->dtype)) {
    if (to_int(ctx, "iota", t->dtype, start, &is))
      return -1;
    /* Check the last value in integer arithmetic: start + n - 1 must not overflow. */
    if (n > 0 && (is > INT64_MAX - (n - 1) || !int_max_ok(t->dtype, is + (n - 1))))
      return mk_errorf(ctx, "iota: %lld values from %lld do not fit in %s", (long long)n,
                       (long long)is, mk_dtype_name(t->dtype));
  }
  switch (t->dtype) {
  case MK_F32: { float *p = t->data; for (int64_t i = 0; i < n; i++) p[i] = (float)(start + (double)i); break; }
  case MK_F64: { double *p = t->data; for (int64_t i = 0; i < n; i++) p[i] = start + (double)i; break; }
  case MK_I32: { int32_t *p = t->data; for (int64_t i = 0; i < n; i++) p[i] = (int32_t)(is + i); break; }
  case MK_I64: { int64_t *p = t->data; for (int64_t i = 0; i < n; i++) p[i] = is + i; break; }
  case MK_U8: { uint8_t *p = t->data; for (int64_t i = 0; i < n; i++) p[i] = (uint8_t)(is + i); break; }
  default: return bad_dtype(ctx, "iota", t, ALL_DTYPES);
  }
  return 0;
}

/* Two float tensors of one dtype and one element count (shapes may differ). */
static int check_pair(mk_ctx_t *ctx, const char *k, const char *xn, const mk_tensor_t *x,
                      const char *yn, const mk_tensor_t *y) {
  char xd[SHAPE_BUF], yd[SHAPE_BUF];
  if (check_cpu(ctx, k, x) || check_cpu(ctx, k, y))
    return -1;
  if (x->dtype != y->dtype || x->numel != y->numel)
    return mk_errorf(ctx, "%s: %s is %s but %s is %s (need the same dtype and element count)", k,
                     xn, desc(x, xd, sizeof(xd)), yn, desc(y, yd, sizeof(yd)));
  if (x->dtype != MK_F32 && x->dtype != MK_F64)
    return bad_dtype(ctx, k, x, FLOAT_DTYPES);
  return 0;
}

static int k_axpy(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  double a = mk_arg_number(&argv[0]);
  const mk_tensor_t *x = argv[1].v.tensor;
  mk_tensor_t *y = argv[2].v.tensor;
  if (check_pair(ctx, "axpy", "x", x, "y", y))
    return -1;
  int64_t n = y->numel;
  if (y->dtype == MK_F32) {
    const float *xp = x->data;
    float *yp = y->data, af = (float)a;
    for (int64_t i = 0; i < n; i++)
      yp[i] += af * xp[i];
  } else {
    const double *xp = x->data;
    double *yp = y->data;
    for (int64_t i = 0; i < n; i++)
      yp[i] += a * xp[i];
  }
  return 0;
}

/* copy(src, dst): dst = src, bit for bit (any dtype): a proc's own backup of a tensor. */
static int k_copy(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const mk_tensor_t *x = argv[0].v.tensor;
  mk_tensor_t *y = argv[1].v.tensor;
  char xd[SHAPE_BUF], yd[SHAPE_BUF];
  if (check_cpu(ctx, "copy", x) || check_cpu(ctx, "copy", y))
    return -1;
  if (x->dtype != y->dtype || x->numel != y->numel)
    return mk_errorf(ctx, "copy: src is %s but dst is %s (need the same dtype and element count)",
                     desc(x, xd, sizeof(xd)), desc(y, yd, sizeof(yd)));
  if (x->data != y->data)
    memmove(y->data, x->data, (size_t)x->numel * mk_dtype_size(x->dtype));
  return 0;
}

static int k_scale(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  mk_tensor_t *t = argv[0].v.tensor;
  double a = mk_arg_number(&argv[1]);
  int64_t n = t->numel;
  if (check_cpu(ctx, "scale", t))
    return -1;
  switch (t->dtype) {
  case MK_F32: { float *p = t->data, af = (float)a; for (int64_t i = 0; i < n; i++) p[i] *= af; break; }
  case MK_F64: { double *p = t->data; for (int64_t i = 0; i < n; i++) p[i] *= a; break; }
  default: return bad_dtype(ctx, "scale", t, FLOAT_DTYPES);
  }
  return 0;
}

static int k_sum(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const mk_tensor_t *t = argv[0].v.tensor;
  int64_t n = t->numel;
  double s = 0.0;
  if (check_cpu(ctx, "sum", t))
    return -1;
  switch (t->dtype) {
  case MK_F32: { const float *p = t->data; for (int64_t i = 0; i < n; i++) s += p[i]; break; }
  case MK_F64: { const double *p = t->data; for (int64_t i = 0; i < n; i++) s += p[i]; break; }
  case MK_I32: { const int32_t *p = t->data; for (int64_t i = 0; i < n; i++) s += p[i]; break; }
  case MK_I64: { const int64_t *p = t->data; for (int64_t i = 0; i < n; i++) s += (double)p[i]; break; }
  case MK_U8: { const uint8_t *p = t->data; for (int64_t i = 0; i < n; i++) s += p[i]; break; }
  default: return bad_dtype(ctx, "sum", t, ALL_DTYPES);
  }
  return mk_return_number(ctx, s);
}

static int k_dot(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const mk_tensor_t *x = argv[0].v.tensor, *y = argv[1].v.tensor;
  double s = 0.0;
  if (check_pair(ctx, "dot", "x", x, "y", y))
    return -1;
  int64_t n = x->numel;
  if (x->dtype == MK_F32) {
    const float *xp = x->data, *yp = y->data;
    for (int64_t i = 0; i < n; i++)
      s += (double)xp[i] * yp[i];
  } else {
    const double *xp = x->data, *yp = y->data;
    for (int64_t i = 0; i < n; i++)
      s += xp[i] * yp[i];
  }
  return mk_return_number(ctx, s);
}

static int check_matrix(mk_ctx_t *ctx, const char *name, const mk_tensor_t *t) {
  char d[SHAPE_BUF];
  if (check_cpu(ctx, "sgemm", t))
    return -1;
  if (t->dtype != MK_F32 || t->ndim != 2)
    return mk_errorf(ctx, "sgemm: %s must be a 2-D f32 tensor, got %s", name, desc(t, d, sizeof(d)));
  /* Default OpenBLAS takes int dimensions. */
  if (t->shape[0] > INT_MAX || t->shape[1] > INT_MAX)
    return mk_errorf(ctx, "sgemm: %s is %s, too large for BLAS", name, desc(t, d, sizeof(d)));
  return 0;
}

static int overlaps(const mk_tensor_t *a, const mk_tensor_t *b) {
  const char *pa = a->data, *pb = b->data;
  return a->nbytes && b->nbytes && pa < pb + b->nbytes && pb < pa + a->nbytes;
}

/* C = alpha * op(A) @ op(B) + beta * C on row-major f32 matrices. */
static int k_sgemm(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  const mk_tensor_t *A = argv[0].v.tensor, *B = argv[1].v.tensor;
  mk_tensor_t *C = argv[2].v.tensor;
  double alpha = argc > 3 ? mk_arg_number(&argv[3]) : 1.0;
  double beta = argc > 4 ? mk_arg_number(&argv[4]) : 0.0;
  int ta = argc > 5 && argv[5].v.b;
  int tb = argc > 6 && argv[6].v.b;
  const char *an = ta ? "A^T" : "A", *bn = tb ? "B^T" : "B";

  if (check_matrix(ctx, "A", A) || check_matrix(ctx, "B", B) || check_matrix(ctx, "C", C))
    return -1;
  /* op(A) is m x k, op(B) is k x n. */
  int64_t m = A->shape[ta], k = A->shape[!ta];
  int64_t kb = B->shape[tb], n = B->shape[!tb];
  if (k != kb)
    return mk_errorf(ctx, "sgemm: %s is %lldx%lld but %s is %lldx%lld (inner dimensions differ)",
                     an, (long long)m, (long long)k, bn, (long long)kb, (long long)n);
  if (C->shape[0] != m || C->shape[1] != n)
    return mk_errorf(ctx, "sgemm: C is %lldx%lld but %s@%s is %lldx%lld", (long long)C->shape[0],
                     (long long)C->shape[1], an, bn, (long long)m, (long long)n);
  /* BLAS leaves the result undefined when C shares memory with an input. */
  if (overlaps(C, A) || overlaps(C, B))
    return mk_error(ctx, "sgemm: C must not share memory with A or B");
  if (m == 0 || n == 0)
    return 0;
  /* Leading dimensions are the stored row lengths; BLAS insists on >= 1. */
  int lda = A->shape[1] > 0 ? (int)A->shape[1] : 1;
  int ldb = B->shape[1] > 0 ? (int)B->shape[1] : 1;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (int)m, (int)n, (int)k, (float)alpha, A->data, lda, B->data, ldb, (float)beta,
              C->data, (int)n);
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sleeps in 10 ms steps so that a cancel is noticed promptly. */
static int k_sleep(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  double secs = mk_arg_number(&argv[0]);
  if (!(secs >= 0.0 && secs <= 86400.0))
    return mk_errorf(ctx, "sleep: seconds must be in [0, 86400], got %g", secs);
  /* A monotonic deadline keeps early wakeups (EINTR) from stretching the total. */
  double end = now_s() + secs;
  for (;;) {
    if (mk_cancelled(ctx))
      return mk_error(ctx, "sleep: cancelled");
    double left = end - now_s();
    if (left <= 0.0)
      return 0;
    if (left > 0.01)
      left = 0.01;
    struct timespec ts = { 0, (long)(left * 1e9) };
    nanosleep(&ts, NULL);
  }
}

static const mk_kernel_t kernels[] = {
  { "noop", k_noop, "", "Does nothing; measures dispatch overhead." },
  { "echo", k_echo, "*", "Returns its arguments unchanged (a tensor comes back as its id)." },
  { "rank", k_rank, "", "Returns this proc's rank and world size." },
  { "fill", k_fill, "tn", "fill(t, v): sets every element of t to v (f32, f64, i32, i64, u8)." },
  { "iota", k_iota, "tn?", "iota(t, start=0): t[i] = start + i (f32, f64, i32, i64, u8)." },
  { "axpy", k_axpy, "ntt", "axpy(alpha, x, y): y = alpha*x + y (f32 or f64, same dtype and numel)." },
  { "copy", k_copy, "tt", "copy(src, dst): dst = src, bit for bit (same dtype and numel)." },
  { "scale", k_scale, "tn", "scale(t, alpha): t = alpha*t (f32, f64)." },
  { "sum", k_sum, "t", "sum(t): sum of all elements as a number, accumulated in double." },
  { "dot", k_dot, "tt", "dot(x, y): inner product as a number (f32 or f64, same dtype and numel)." },
  { "sgemm", k_sgemm, "tttn?nBB",
    "sgemm(A, B, C, alpha=1, beta=0, transA=false, transB=false): "
    "C = alpha*op(A)@op(B) + beta*C, 2-D f32 row-major (OpenBLAS)." },
  { "sleep", k_sleep, "n", "sleep(s): sleeps s seconds (0..86400), stopping early if cancelled." },
};

MK_EXPORT const mk_library_t *monarch_kernels(void) {
  static const mk_library_t lib = {
    MK_ABI_VERSION, "basic", (int)(sizeof(kernels) / sizeof(kernels[0])), kernels,
  };
  return &lib;
}
