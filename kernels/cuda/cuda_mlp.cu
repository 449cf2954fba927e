/*
 * cuda_mlp.cu - the GPU kernel library "cuda_mlp", the CUDA twin of the model
 * kernels of the CPU library "mlp" (kernels/cpu/mlp.c): the same names,
 * signatures, layouts and hyperparameters, on tensors in device memory.
 *
 *     P = W1 [in x hidden] | b1 [hidden] | W2 [hidden x out] | b2 [out]
 *     S = m | v (Adam moments, each laid out like P)
 *
 * examples/train.lua loads "mlp" first and then "cuda_mlp", whose kernels
 * shadow mlp's of the same name: the data loader (digits_info, digits_load)
 * stays mlp's and fills CPU tensors on the proc, and mlp_copy moves them into
 * GPU tensors on the same proc.
 *
 * Determinism: every random choice (the initial weights, each epoch's batch
 * order) comes from the same counter-based generator as mlp.c, run on the
 * host, so a GPU run draws exactly the batches a CPU run draws. On the device
 * there are no atomics: every sum runs in a fixed order (column sums one
 * thread per column over the rows in order; per-row losses summed on the host
 * in row order), and cuBLAS gives the same bits for the same call on the same
 * GPU. The results are not bit-identical to mlp's (other summation order in
 * sgemm, fused multiply-adds), only reproducible.
 *
 * Work goes on ctx->stream; when that is NULL (the legacy default stream) a
 * kernel synchronizes before returning, as cuda_basic's do. Every CUDA and
 * cuBLAS status is checked; every error message starts with the kernel name.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu/mlp_common.h" /* the generator and constants of mlp.c */
#include "monarch_kernel.h"

#define CM_THREADS 256          /* threads per block of every kernel */
#define CM_MAX_BLOCKS 8192      /* most blocks of a grid-stride kernel */
#define CM_MAX_DEVICES 64       /* devices whose cuBLAS handle and scratch are cached */
#define CM_SHAPE_BUF 200        /* room for "bf16[" + MK_MAX_DIMS dims + "] on cuda:N" */
#define CM_DIM_BUF 24           /* one wanted dimension as text: 20 digits and a sign */
#define CM_MAX_FEATURES 4096    /* as MLP_MAX_FEATURES */
#define CM_MAX_CLASSES 1024     /* as MLP_MAX_CLASSES */
#define CM_MAX_HIDDEN 65536     /* as MLP_MAX_HIDDEN */
#define CM_MAX_BATCH 65536      /* as MLP_MAX_BATCH */
#define CM_EVAL_CHUNK 4096      /* rows evaluated per pass (bounds device scratch) */


/* Row status written by the softmax kernel. */
enum { ROW_WRONG = 0, ROW_RIGHT = 1, ROW_BAD_LABEL = 2 };


/* ---- errors and checks --------------------------------------------------------- */

/* "f32[359x64]" and where it lives, for messages that show what a tensor is. */
static const char *desc(const mk_tensor_t *t, char *buf, size_t n) {
  size_t off = (size_t)snprintf(buf, n, "%s[", mk_dtype_name(t->dtype));
  for (int i = 0; i < t->ndim && i < MK_MAX_DIMS && off < n; i++)
    off += (size_t)snprintf(buf + off, n - off, i ? "x%lld" : "%lld", (long long)t->shape[i]);
  if (off < n) {
    if (t->device >= 0) snprintf(buf + off, n - off, "] on cuda:%d", t->device);
    else snprintf(buf + off, n - off, "] on the CPU");
  }
  return buf;
}

static int cuda_err(mk_ctx_t *ctx, const char *k, const char *what, cudaError_t rc) {
  return mk_errorf(ctx, "%s: %s failed: %s", k, what, cudaGetErrorString(rc));
}

static cudaStream_t stream_of(mk_ctx_t *ctx) { return (cudaStream_t)ctx->stream; }

/* Makes t's device current; refuses CPU tensors by name. */
static int on_device(mk_ctx_t *ctx, const char *k, const char *name, const mk_tensor_t *t) {
  int cur = -1;
  cudaError_t rc;
  if (t->device < 0)
    return mk_errorf(ctx, "%s: cuda_mlp is a GPU library; %s (tensor %llu) is on the CPU (use mlp)", k, name,
                     (unsigned long long)t->id);
  if (t->device >= CM_MAX_DEVICES)
    return mk_errorf(ctx, "%s: %s is on cuda:%d, beyond CM_MAX_DEVICES (%d)", k, name, t->device, CM_MAX_DEVICES);
  if ((rc = cudaGetDevice(&cur)) != cudaSuccess) return cuda_err(ctx, k, "cudaGetDevice", rc);
  if (cur != t->device && (rc = cudaSetDevice(t->device)) != cudaSuccess) return cuda_err(ctx, k, "cudaSetDevice", rc);
  return 0;
}

#define ANY -1   /* check_tensor: any size in this dimension */
#define ONE_D -2 /* check_tensor: the tensor is 1-D */

/*
 * Checks that t is a GPU tensor on dev (when dev >= 0) of dtype and shape: a
 * 1-D tensor of d0 elements when d1 == ONE_D, otherwise 2-D d0 x d1 (ANY:
 * any size there). Names the tensor and both shapes on failure.
 */
static int check_tensor(mk_ctx_t *ctx, const char *k, const char *name, const mk_tensor_t *t, int dev,
                        mk_dtype_t dtype, int64_t d0, int64_t d1) {
  char d[CM_SHAPE_BUF];
  if (on_device(ctx, k, name, t)) return -1;
  if (dev >= 0 && t->device != dev)
    return mk_errorf(ctx, "%s: %s is on cuda:%d but P is on cuda:%d", k, name, t->device, dev);
  int want_ndim = d1 == ONE_D ? 1 : 2;
  if (t->dtype == dtype && t->ndim == want_ndim && (d0 < 0 || t->shape[0] == d0) &&
      (want_ndim == 1 || d1 < 0 || t->shape[1] == d1))
    return 0;
  char w0[CM_DIM_BUF], w1[CM_DIM_BUF];
  snprintf(w0, sizeof(w0), d0 < 0 ? "*" : "%lld", (long long)d0);
  if (want_ndim == 1)
    return mk_errorf(ctx, "%s: %s must be a GPU %s[%s], got %s", k, name, mk_dtype_name(dtype), w0, desc(t, d, sizeof(d)));
  snprintf(w1, sizeof(w1), d1 < 0 ? "*" : "%lld", (long long)d1);
  return mk_errorf(ctx, "%s: %s must be a GPU %s[%sx%s], got %s", k, name, mk_dtype_name(dtype), w0, w1,
                   desc(t, d, sizeof(d)));
}

static int check_range(mk_ctx_t *ctx, const char *k, const char *name, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    return mk_errorf(ctx, "%s: %s must be in %lld..%lld, got %lld", k, name, (long long)lo, (long long)hi,
                     (long long)v);
  return 0;
}

/* After launching: reports a bad launch, and on the default stream waits so
 * the work is done (or its failure known) when the call returns. */
static int finish(mk_ctx_t *ctx, const char *k) {
  cudaError_t rc = cudaGetLastError();
  if (rc != cudaSuccess) return cuda_err(ctx, k, "kernel launch", rc);
  if (ctx->stream == NULL && (rc = cudaStreamSynchronize(0)) != cudaSuccess)
    return cuda_err(ctx, k, "cudaStreamSynchronize", rc);
  return 0;
}

static unsigned grid_for(int64_t n) {
  int64_t b = (n + CM_THREADS - 1) / CM_THREADS;
  return (unsigned)(b < 1 ? 1 : b > CM_MAX_BLOCKS ? CM_MAX_BLOCKS : b);
}

/* ---- per-device state: cuBLAS handle and a growing scratch buffer ----------- */

static cublasHandle_t blas[CM_MAX_DEVICES];
static void *dscratch[CM_MAX_DEVICES];
static size_t dscratch_len[CM_MAX_DEVICES];

static const char *blas_status(cublasStatus_t st) { return cublasGetStatusString(st); }

static cublasHandle_t blas_handle(mk_ctx_t *ctx, const char *k, int dev) {
  if (blas[dev] == NULL) {
    cublasStatus_t st = cublasCreate(&blas[dev]);
    if (st != CUBLAS_STATUS_SUCCESS) {
      blas[dev] = NULL;
      mk_errorf(ctx, "%s: cublasCreate failed: %s", k, blas_status(st));
      return NULL;
    }
  }
  cublasStatus_t st = cublasSetStream(blas[dev], stream_of(ctx));
  if (st != CUBLAS_STATUS_SUCCESS) {
    mk_errorf(ctx, "%s: cublasSetStream failed: %s", k, blas_status(st));
    return NULL;
  }
  return blas[dev];
}

/* At least n bytes of device memory on dev, kept for later calls (owned here). */
static void *device_scratch(mk_ctx_t *ctx, const char *k, int dev, size_t n) {
  if (dscratch_len[dev] >= n) return dscratch[dev];
  cudaError_t rc;
  if (dscratch[dev] != NULL) {
    /* The old buffer may still be read by queued work: wait before freeing it. */
    if ((rc = cudaStreamSynchronize(stream_of(ctx))) != cudaSuccess) {
      cuda_err(ctx, k, "cudaStreamSynchronize", rc);
      return NULL;
    }
    if ((rc = cudaFree(dscratch[dev])) != cudaSuccess) {
      cuda_err(ctx, k, "cudaFree of scratch", rc);
      return NULL;
    }
    dscratch[dev] = NULL;
    dscratch_len[dev] = 0;
  }
  if ((rc = cudaMalloc(&dscratch[dev], n)) != cudaSuccess) {
    dscratch[dev] = NULL;
    mk_errorf(ctx, "%s: cudaMalloc of %zu bytes of scratch failed: %s", k, n, cudaGetErrorString(rc));
    return NULL;
  }
  dscratch_len[dev] = n;
  return dscratch[dev];
}

/* Host <-> device copy on the call's stream, waited for (the host side is call scratch). */
static int copy_sync(mk_ctx_t *ctx, const char *k, void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
  cudaError_t rc = cudaMemcpyAsync(dst, src, n, kind, stream_of(ctx));
  if (rc != cudaSuccess) return cuda_err(ctx, k, "cudaMemcpyAsync", rc);
  if ((rc = cudaStreamSynchronize(stream_of(ctx))) != cudaSuccess) return cuda_err(ctx, k, "cudaStreamSynchronize", rc);
  return 0;
}

/* ---- the model layout ------------------------------------------------------------ */

typedef struct {
  int in, hidden, out;
  float *w1, *b1, *w2, *b2; /* views into one flat device tensor, in this order */
} model_t;

static void model_view(model_t *m, float *flat) {
  m->w1 = flat;
  m->b1 = m->w1 + (size_t)m->in * (size_t)m->hidden;
  m->w2 = m->b1 + m->hidden;
  m->b2 = m->w2 + (size_t)m->hidden * (size_t)m->out;
}

static int model_check(mk_ctx_t *ctx, const char *k, model_t *m, const mk_tensor_t *P, int64_t in, int64_t hidden,
                       int64_t out) {
  if (check_range(ctx, k, "input features", in, 1, CM_MAX_FEATURES) ||
      check_range(ctx, k, "hidden", hidden, 1, CM_MAX_HIDDEN) || check_range(ctx, k, "classes", out, 2, CM_MAX_CLASSES))
    return -1;
  m->in = (int)in, m->hidden = (int)hidden, m->out = (int)out;
  int64_t n = in * hidden + hidden + hidden * out + out;
  char d[CM_SHAPE_BUF];
  if (on_device(ctx, k, "P (parameters)", P)) return -1;
  if (P->dtype != MK_F32 || P->ndim != 1 || P->numel != n)
    return mk_errorf(ctx, "%s: P (parameters) must be a GPU f32[%lld] for %lld inputs, %lld hidden, %lld classes; got %s",
                     k, (long long)n, (long long)in, (long long)hidden, (long long)out, desc(P, d, sizeof(d)));
  model_view(m, (float *)P->data);
  return 0;
}

/* ---- device code ---------------------------------------------------------------- */

/* xb[i, :] = x[rows[i], :] for b rows of f features. */
__global__ void gather_rows_k(const float *x, const int32_t *rows, int b, int f, float *xb) {
  int64_t n = (int64_t)b * f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)blockDim.x * gridDim.x) {
    int64_t r = i / f, c = i % f;
    xb[i] = x[(int64_t)rows[r] * f + c];
  }
}

/* a[i, j] += bias[j], then ReLU when relu is set. */
__global__ void bias_k(float *a, const float *bias, int b, int n, int relu) {
  int64_t total = (int64_t)b * n;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)blockDim.x * gridDim.x) {
    float v = a[i] + bias[i % n];
    a[i] = relu && !(v > 0.0f) ? 0.0f : v;
  }
}

/*
 * One thread per row of logits z[b x n] (labels y[rows[i]], or y[i] when rows
 * is NULL): the row's cross-entropy into loss[i] and its status into ok[i]
 * (first maximum wins, as mlp.c). When g != 0 the row becomes
 * g * (softmax - onehot), the gradient of the mean loss.
 */
__global__ void softmax_xent_k(float *z, const int32_t *y, const int32_t *rows, int b, int n, float g, double *loss,
                               int32_t *ok) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= b) return;
  float *zi = z + (int64_t)i * n;
  int label = y[rows ? rows[i] : i];
  if (label < 0 || label >= n) {
    ok[i] = ROW_BAD_LABEL;
    loss[i] = 0.0;
    if (g != 0.0f)
      for (int j = 0; j < n; j++) zi[j] = 0.0f;
    return;
  }
  int arg = 0;
  for (int j = 1; j < n; j++) arg = zi[j] > zi[arg] ? j : arg;
  double zmax = zi[arg], sum = 0.0;
  for (int j = 0; j < n; j++) sum += exp((double)zi[j] - zmax);
  loss[i] = log(sum) - ((double)zi[label] - zmax);
  ok[i] = arg == label ? ROW_RIGHT : ROW_WRONG;
  if (g == 0.0f) return;
  for (int j = 0; j < n; j++) zi[j] = g * ((float)(exp((double)zi[j] - zmax) / sum) - (j == label ? 1.0f : 0.0f));
}

/* out[j] = sum over rows of a[i, j], one thread per column, rows in order: reproducible. */
__global__ void col_sums_k(const float *a, int b, int n, float *out) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  float s = 0.0f;
  for (int i = 0; i < b; i++) s += a[(int64_t)i * n + j];
  out[j] = s;
}

/* d[i] = 0 where the ReLU was off (a[i] == 0). */
__global__ void relu_back_k(float *d, const float *a, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)blockDim.x * gridDim.x)
    d[i] = a[i] > 0.0f ? d[i] : 0.0f;
}

/* One Adam step, elementwise, with mlp.c's formula. */
__global__ void adam_k(float *p, float *mo, float *v, const float *g, int64_t n, float sc, float b1, float b2, float c1,
                       float c2, float lr, float eps) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)blockDim.x * gridDim.x) {
    float gi = g[i] * sc;
    mo[i] = b1 * mo[i] + (1.0f - b1) * gi;
    v[i] = b2 * v[i] + (1.0f - b2) * gi * gi;
    p[i] -= lr * (mo[i] / c1) / (sqrtf(v[i] / c2) + eps);
  }
}

/*
 * Row-major C[m x n] = op(A) @ op(B) + beta*C, as mlp.c's gemm. cuBLAS is
 * column-major and a row-major matrix is its transpose seen column-major, so
 * this computes C^T = op(B)^T @ op(A)^T: B and A swap places.
 */
static int gemm(mk_ctx_t *ctx, const char *k, cublasHandle_t h, int ta, int tb, int m, int n, int kk, const float *A,
                const float *B, float beta, float *C) {
  float one = 1.0f;
  cublasStatus_t st = cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, kk, &one, B,
                                  tb ? kk : n, A, ta ? m : kk, &beta, C, n);
  if (st != CUBLAS_STATUS_SUCCESS) return mk_errorf(ctx, "%s: cublasSgemm failed: %s", k, blas_status(st));
  return 0;
}

/* Hidden activations A1 = relu(X @ W1 + b1) and logits Z = A1 @ W2 + b2 for b rows, on the device. */
static int forward(mk_ctx_t *ctx, const char *k, cublasHandle_t h, const model_t *m, int b, const float *x, float *a1,
                   float *z) {
  cudaStream_t s = stream_of(ctx);
  if (gemm(ctx, k, h, 0, 0, b, m->hidden, m->in, x, m->w1, 0.0f, a1)) return -1;
  bias_k<<<grid_for((int64_t)b * m->hidden), CM_THREADS, 0, s>>>(a1, m->b1, b, m->hidden, 1);
  if (gemm(ctx, k, h, 0, 0, b, m->out, m->hidden, a1, m->w2, 0.0f, z)) return -1;
  bias_k<<<grid_for((int64_t)b * m->out), CM_THREADS, 0, s>>>(z, m->b2, b, m->out, 0);
  cudaError_t rc = cudaGetLastError();
  return rc == cudaSuccess ? 0 : cuda_err(ctx, k, "kernel launch", rc);
}

/*
 * Copies b per-row losses and statuses to the host (into hl and hok, the
 * caller's call scratch) and adds them up in row order. A bad label is
 * reported with its value and row (rows maps batch position to the row of Y;
 * NULL: row0 + position), read back from Y.
 */
static int tally(mk_ctx_t *ctx, const char *k, const double *dloss, const int32_t *dok, int b, const int32_t *rows,
                 int64_t row0, const int32_t *dy, int out, double *hl, int32_t *hok, double *loss, int64_t *correct) {
  if (copy_sync(ctx, k, hl, dloss, (size_t)b * sizeof(double), cudaMemcpyDeviceToHost) ||
      copy_sync(ctx, k, hok, dok, (size_t)b * sizeof(int32_t), cudaMemcpyDeviceToHost))
    return -1;
  for (int i = 0; i < b; i++) {
    if (hok[i] == ROW_BAD_LABEL) {
      int64_t r = rows ? rows[i] : row0 + i;
      int32_t label = 0;
      if (copy_sync(ctx, k, &label, dy + r, sizeof(label), cudaMemcpyDeviceToHost)) return -1;
      return mk_errorf(ctx, "%s: label %d of row %lld is outside 0..%d (rank %d)", k, (int)label, (long long)r, out - 1,
                       ctx->rank);
    }
    *loss += hl[i];
    *correct += hok[i] == ROW_RIGHT;
  }
  return 0;
}

/* ---- kernels ---------------------------------------------------------------------- */

/*
 * mlp_init(P, in, hidden, out, seed): mlp.c's initial weights (He for W1,
 * Glorot for W2, zero biases), drawn on the host from the same generator and
 * copied to the device: the same bits as a CPU init.
 */
static int k_mlp_init(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const char *k = "mlp_init";
  model_t m;
  mk_tensor_t *P = argv[0].v.tensor;
  if (model_check(ctx, k, &m, P, argv[1].v.i, argv[2].v.i, argv[3].v.i)) return -1;
  float *host = (float *)mk_scratch(ctx, (size_t)P->numel * sizeof(float));
  if (host == NULL) return mk_errorf(ctx, "%s: no scratch memory for %lld parameters", k, (long long)P->numel);
  model_t hm = m;
  model_view(&hm, host);
  rng_t r = rng_make(argv[4].v.i, TAG_INIT, 0, 0);
  float a1 = sqrtf(6.0f / (float)m.in), a2 = sqrtf(6.0f / (float)(m.hidden + m.out));
  for (size_t i = 0; i < (size_t)m.in * (size_t)m.hidden; i++) hm.w1[i] = a1 * rng_sym(&r);
  for (size_t i = 0; i < (size_t)m.hidden * (size_t)m.out; i++) hm.w2[i] = a2 * rng_sym(&r);
  memset(hm.b1, 0, (size_t)m.hidden * sizeof(float));
  memset(hm.b2, 0, (size_t)m.out * sizeof(float));
  return copy_sync(ctx, k, P->data, host, (size_t)P->numel * sizeof(float), cudaMemcpyHostToDevice);
}

/*
 * mlp_forward_backward(P, X, Y, G, hidden, classes, batch, seed, epoch, step):
 * batch `step` of `epoch` from this proc's shard X/Y, in mlp.c's order (a
 * shuffle keyed by seed, epoch and rank); G = gradient of the batch's mean
 * cross-entropy, laid out like P. Returns the summed loss and the number of
 * correct predictions. All tensors on one GPU.
 */
static int k_mlp_forward_backward(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const char *k = "mlp_forward_backward";
  mk_tensor_t *P = argv[0].v.tensor, *X = argv[1].v.tensor, *Y = argv[2].v.tensor, *G = argv[3].v.tensor;
  int64_t batch = argv[6].v.i, seed = argv[7].v.i, epoch = argv[8].v.i, step = argv[9].v.i;
  model_t m, g;
  if (check_tensor(ctx, k, "X", X, -1, MK_F32, ANY, ANY) || model_check(ctx, k, &m, P, X->shape[1], argv[4].v.i, argv[5].v.i))
    return -1;
  int dev = P->device;
  int n = X->shape[0] > INT_MAX ? INT_MAX : (int)X->shape[0];
  if (check_tensor(ctx, k, "X", X, dev, MK_F32, ANY, ANY) || check_tensor(ctx, k, "Y", Y, dev, MK_I32, X->shape[0], ONE_D) ||
      check_tensor(ctx, k, "G (gradients)", G, dev, MK_F32, P->numel, ONE_D) ||
      check_range(ctx, k, "batch", batch, 1, n < CM_MAX_BATCH ? n : CM_MAX_BATCH) ||
      check_range(ctx, k, "epoch", epoch, 0, INT32_MAX) || check_range(ctx, k, "step", step, 0, n / batch - 1))
    return -1;
  if (G == P) return mk_errorf(ctx, "%s: G must not be P", k);
  int b = (int)batch;
  g = m;
  model_view(&g, (float *)G->data);

  /* The epoch's order on the host, exactly as mlp.c draws it; this step's rows go to the device. */
  /* Host scratch, one block: per-row losses | statuses | the epoch's order. */
  char *hmem = (char *)mk_scratch(ctx, (size_t)b * (sizeof(double) + sizeof(int32_t)) + (size_t)n * sizeof(int32_t));
  if (hmem == NULL) return mk_errorf(ctx, "%s: no scratch memory for %d row indices", k, n);
  double *hl = (double *)hmem;
  int32_t *hok = (int32_t *)(hl + b), *perm = hok + b;
  rng_t r = rng_make(seed, TAG_BATCH, epoch, ctx->rank);
  shuffle(&r, perm, n);
  const int32_t *rows = perm + (size_t)step * (size_t)b;

  /* Device scratch: rows | losses | statuses | xb | a1 | z | d1 (doubles first, for alignment). */
  size_t fl = (size_t)b * ((size_t)m.in + 2 * (size_t)m.hidden + (size_t)m.out);
  size_t need = (size_t)b * sizeof(double) + 2 * (size_t)b * sizeof(int32_t) + fl * sizeof(float);
  char *mem = (char *)device_scratch(ctx, k, dev, need);
  if (mem == NULL) return -1;
  double *dloss = (double *)mem;
  int32_t *drows = (int32_t *)(mem + (size_t)b * sizeof(double)), *dok = drows + b;
  float *xb = (float *)(dok + b), *a1 = xb + (size_t)b * (size_t)m.in;
  float *z = a1 + (size_t)b * (size_t)m.hidden, *d1 = z + (size_t)b * (size_t)m.out;
  cublasHandle_t h = blas_handle(ctx, k, dev);
  if (h == NULL) return -1;
  cudaStream_t s = stream_of(ctx);
  cudaError_t rc = cudaMemcpyAsync(drows, rows, (size_t)b * sizeof(int32_t), cudaMemcpyHostToDevice, s);
  if (rc != cudaSuccess) return cuda_err(ctx, k, "cudaMemcpyAsync of the batch rows", rc);
  gather_rows_k<<<grid_for((int64_t)b * m.in), CM_THREADS, 0, s>>>((const float *)X->data, drows, b, m.in, xb);
  if (forward(ctx, k, h, &m, b, xb, a1, z)) return -1;
  softmax_xent_k<<<(b + CM_THREADS - 1) / CM_THREADS, CM_THREADS, 0, s>>>(z, (const int32_t *)Y->data, drows, b, m.out,
                                                                          1.0f / (float)b, dloss, dok); /* z = dL/dz */
  if (gemm(ctx, k, h, 1, 0, m.hidden, m.out, b, a1, z, 0.0f, g.w2)) return -1; /* dW2 = A1^T dZ */
  col_sums_k<<<(m.out + CM_THREADS - 1) / CM_THREADS, CM_THREADS, 0, s>>>(z, b, m.out, g.b2);
  if (gemm(ctx, k, h, 0, 1, b, m.hidden, m.out, z, m.w2, 0.0f, d1)) return -1; /* dA1 = dZ W2^T */
  relu_back_k<<<grid_for((int64_t)b * m.hidden), CM_THREADS, 0, s>>>(d1, a1, (int64_t)b * m.hidden);
  if (gemm(ctx, k, h, 1, 0, m.in, m.hidden, b, xb, d1, 0.0f, g.w1)) return -1; /* dW1 = X^T dA1 */
  col_sums_k<<<(m.hidden + CM_THREADS - 1) / CM_THREADS, CM_THREADS, 0, s>>>(d1, b, m.hidden, g.b1);
  if ((rc = cudaGetLastError()) != cudaSuccess) return cuda_err(ctx, k, "kernel launch", rc);
  double loss = 0.0;
  int64_t correct = 0;
  if (tally(ctx, k, dloss, dok, b, rows, 0, (const int32_t *)Y->data, m.out, hl, hok, &loss, &correct)) return -1;
  int ret = mk_return_number(ctx, loss);
  return ret ? ret : mk_return_int(ctx, correct);
}

/*
 * mlp_adam(P, G, S, lr, t, grad_scale): one Adam step t (1-based) on P with
 * gradient grad_scale*G; S holds the moments m | v. mlp.c's formula and
 * hyperparameters, elementwise on the device.
 */
static int k_mlp_adam(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const char *k = "mlp_adam";
  mk_tensor_t *P = argv[0].v.tensor, *G = argv[1].v.tensor, *S = argv[2].v.tensor;
  double lr = mk_arg_number(&argv[3]), scale = mk_arg_number(&argv[5]);
  int64_t t = argv[4].v.i;
  if (check_tensor(ctx, k, "P (parameters)", P, -1, MK_F32, ANY, ONE_D)) return -1;
  if (check_tensor(ctx, k, "G (gradients)", G, P->device, MK_F32, P->numel, ONE_D) ||
      check_tensor(ctx, k, "S (Adam state)", S, P->device, MK_F32, 2 * P->numel, ONE_D) ||
      check_range(ctx, k, "t (step)", t, 1, INT32_MAX))
    return -1;
  if (!(lr > 0.0 && lr < 1e3) || !isfinite(scale))
    return mk_errorf(ctx, "%s: want 0 < lr < 1000 and a finite grad_scale, got lr=%g grad_scale=%g", k, lr, scale);
  float c1 = (float)(1.0 - pow(MLP_ADAM_BETA1, (double)t)), c2 = (float)(1.0 - pow(MLP_ADAM_BETA2, (double)t));
  float *p = (float *)P->data, *mo = (float *)S->data;
  adam_k<<<grid_for(P->numel), CM_THREADS, 0, stream_of(ctx)>>>(p, mo, mo + P->numel, (const float *)G->data, P->numel,
                                                                 (float)scale, (float)MLP_ADAM_BETA1, (float)MLP_ADAM_BETA2,
                                                                 c1, c2, (float)lr, (float)MLP_ADAM_EPS);
  return finish(ctx, k);
}

/*
 * mlp_evaluate(P, X, Y, hidden, classes): summed cross-entropy, number of
 * correct predictions and number of rows over all of X/Y, in chunks of
 * CM_EVAL_CHUNK rows.
 */
static int k_mlp_evaluate(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const char *k = "mlp_evaluate";
  mk_tensor_t *P = argv[0].v.tensor, *X = argv[1].v.tensor, *Y = argv[2].v.tensor;
  model_t m;
  if (check_tensor(ctx, k, "X", X, -1, MK_F32, ANY, ANY) || model_check(ctx, k, &m, P, X->shape[1], argv[3].v.i, argv[4].v.i))
    return -1;
  int dev = P->device;
  if (check_tensor(ctx, k, "X", X, dev, MK_F32, ANY, ANY) || check_tensor(ctx, k, "Y", Y, dev, MK_I32, X->shape[0], ONE_D))
    return -1;
  if (X->shape[0] > INT_MAX) return mk_errorf(ctx, "%s: X has %lld rows; at most %d", k, (long long)X->shape[0], INT_MAX);
  int n = (int)X->shape[0];
  int c = n < CM_EVAL_CHUNK ? (n > 0 ? n : 1) : CM_EVAL_CHUNK;
  size_t need = (size_t)c * (sizeof(double) + sizeof(int32_t) + ((size_t)m.hidden + (size_t)m.out) * sizeof(float));
  char *mem = (char *)device_scratch(ctx, k, dev, need);
  if (mem == NULL) return -1;
  double *dloss = (double *)mem;
  int32_t *dok = (int32_t *)(dloss + c);
  float *a1 = (float *)(dok + c), *z = a1 + (size_t)c * (size_t)m.hidden;
  char *hmem = (char *)mk_scratch(ctx, (size_t)c * (sizeof(double) + sizeof(int32_t)));
  if (hmem == NULL) return mk_errorf(ctx, "%s: no scratch memory for %d rows", k, c);
  double *hl = (double *)hmem;
  int32_t *hok = (int32_t *)(hl + c);
  cublasHandle_t h = blas_handle(ctx, k, dev);
  if (h == NULL) return -1;
  const float *x = (const float *)X->data;
  const int32_t *y = (const int32_t *)Y->data;
  double loss = 0.0;
  int64_t correct = 0;
  for (int i0 = 0; i0 < n; i0 += c) {
    int b = n - i0 < c ? n - i0 : c;
    if (mk_cancelled(ctx)) return mk_errorf(ctx, "%s: cancelled", k);
    if (forward(ctx, k, h, &m, b, x + (size_t)i0 * (size_t)m.in, a1, z)) return -1;
    softmax_xent_k<<<(b + CM_THREADS - 1) / CM_THREADS, CM_THREADS, 0, stream_of(ctx)>>>(z, y + i0, NULL, b, m.out, 0.0f,
                                                                                        dloss, dok);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess) return cuda_err(ctx, k, "kernel launch", rc);
    if (tally(ctx, k, dloss, dok, b, NULL, i0, y, m.out, hl, hok, &loss, &correct)) return -1;
  }
  int ret = mk_return_number(ctx, loss);
  ret = ret ? ret : mk_return_int(ctx, correct);
  return ret ? ret : mk_return_int(ctx, n);
}

/* mlp_bytes(t): the raw bytes of a tensor (GPU or CPU), so that one proc's copy can be fetched alone. */
static int k_mlp_bytes(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const char *k = "mlp_bytes";
  const mk_tensor_t *t = argv[0].v.tensor;
  if (t->device < 0) return mk_return_bytes(ctx, t->data, t->nbytes);
  if (on_device(ctx, k, "the tensor", t)) return -1;
  void *host = mk_scratch(ctx, t->nbytes > 0 ? t->nbytes : 1);
  if (host == NULL) return mk_errorf(ctx, "%s: no scratch memory for %zu bytes", k, t->nbytes);
  if (t->nbytes > 0 && copy_sync(ctx, k, host, t->data, t->nbytes, cudaMemcpyDeviceToHost)) return -1;
  return mk_return_bytes(ctx, host, t->nbytes);
}

/*
 * mlp_copy(src, dst): copies src into dst on this proc, either way between
 * CPU and GPU (or GPU to GPU); same dtype and element count. Moves what mlp's
 * digits_load put in CPU tensors into GPU tensors without a trip through the
 * controller.
 */
static int k_mlp_copy(mk_ctx_t *ctx, int argc, const mk_arg_t *argv) {
  (void)argc;
  const char *k = "mlp_copy";
  const mk_tensor_t *src = argv[0].v.tensor;
  mk_tensor_t *dst = argv[1].v.tensor;
  char sd[CM_SHAPE_BUF], dd[CM_SHAPE_BUF];
  if (src->dtype != dst->dtype || src->numel != dst->numel)
    return mk_errorf(ctx, "%s: src is %s but dst is %s (need the same dtype and element count)", k,
                     desc(src, sd, sizeof(sd)), desc(dst, dd, sizeof(dd)));
  if (src->device < 0 && dst->device < 0)
    return mk_errorf(ctx, "%s: both tensors are on the CPU; one must be a GPU tensor", k);
  if (src->device >= 0 && dst->device >= 0 && src->device != dst->device)
    return mk_errorf(ctx, "%s: src is on cuda:%d but dst on cuda:%d", k, src->device, dst->device);
  const mk_tensor_t *gt = dst->device >= 0 ? dst : src;
  if (on_device(ctx, k, "the GPU tensor", gt)) return -1;
  cudaMemcpyKind kind = src->device < 0   ? cudaMemcpyHostToDevice
                        : dst->device < 0 ? cudaMemcpyDeviceToHost
                                          : cudaMemcpyDeviceToDevice;
  if (src->nbytes == 0) return 0;
  return copy_sync(ctx, k, dst->data, src->data, src->nbytes, kind);
}

static const mk_kernel_t kernels[] = {
  {"mlp_init", k_mlp_init, "tiiii", "mlp_init(P, in, hidden, classes, seed): mlp's initial weights, into a GPU P."},
  {"mlp_forward_backward", k_mlp_forward_backward, "ttttiiiiii",
   "mlp_forward_backward(P, X, Y, G, hidden, classes, batch, seed, epoch, step): G = mean gradient of the "
   "batch on the GPU; returns summed loss, correct count."},
  {"mlp_adam", k_mlp_adam, "tttnin", "mlp_adam(P, G, S, lr, t, grad_scale): one Adam step with grad_scale*G on the GPU."},
  {"mlp_evaluate", k_mlp_evaluate, "tttii",
   "mlp_evaluate(P, X, Y, hidden, classes): summed loss, correct count, rows (GPU tensors)."},
  {"mlp_bytes", k_mlp_bytes, "t", "mlp_bytes(t): the tensor's raw bytes (GPU or CPU)."},
  {"mlp_copy", k_mlp_copy, "tt", "mlp_copy(src, dst): copies a tensor between CPU and GPU on this proc."},
};

extern "C" MK_EXPORT const mk_library_t *monarch_kernels(void) {
  static const mk_library_t lib = {
    MK_ABI_VERSION, "cuda_mlp", (int)(sizeof(kernels) / sizeof(kernels[0])), kernels,
  };
  return &lib;
}
