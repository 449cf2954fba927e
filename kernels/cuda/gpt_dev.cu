/*
 * gpt_dev.cu - the device side every cuda_gpt kernel shares (gpt_cuda.h):
 * making the call's device current, errors that name the kernel and carry
 * CUDA's or cuBLAS's message, a per-device scratch buffer kept across calls,
 * copies, the row-major sgemm on cuBLAS, and the all-reduce over a group.
 */
#include <stdio.h>

#include "gpt_cuda.h"

static cublasHandle_t blas[GCU_MAX_DEVICES];
static void *dscratch[GCU_MAX_DEVICES];
static size_t dscratch_len[GCU_MAX_DEVICES];

int gcu_cuda(gcu_t *g, const char *what, cudaError_t rc) {
  if (rc == cudaSuccess) return 0;
  return mk_errorf(g->ctx, "%s: %s failed: %s", g->k, what, cudaGetErrorString(rc));
}

/* After a series of launches: a bad launch (or an earlier asynchronous failure) is reported here. */
int gcu_launched(gcu_t *g) { return gcu_cuda(g, "kernel launch", cudaGetLastError()); }

unsigned gcu_grid(int64_t n) {
  int64_t b = (n + GCU_THREADS - 1) / GCU_THREADS;
  return (unsigned)(b < 1 ? 1 : b > GCU_MAX_BLOCKS ? GCU_MAX_BLOCKS : b);
}

/* Blocks for one warp per row (GCU_WARPS rows per block); the row kernels stride over the rest. */
unsigned gcu_rows_grid(int64_t rows) {
  int64_t b = (rows + GCU_WARPS - 1) / GCU_WARPS;
  return (unsigned)(b < 1 ? 1 : b > GCU_MAX_BLOCKS ? GCU_MAX_BLOCKS : b);
}

/* Makes dev current and binds its cuBLAS handle (made once per device) to the call's stream. */
int gcu_open(gcu_t *g, mk_ctx_t *ctx, const char *k, int dev) {
  int cur = -1;
  cublasStatus_t st;
  g->ctx = ctx, g->k = k, g->dev = dev, g->s = (cudaStream_t)ctx->stream, g->h = NULL;
  if (dev < 0 || dev >= GCU_MAX_DEVICES)
    return mk_errorf(ctx, "%s: device %d is outside 0..%d (GCU_MAX_DEVICES)", k, dev, GCU_MAX_DEVICES - 1);
  if (gcu_cuda(g, "cudaGetDevice", cudaGetDevice(&cur))) return -1;
  if (cur != dev && gcu_cuda(g, "cudaSetDevice", cudaSetDevice(dev))) return -1;
  if (blas[dev] == NULL && (st = cublasCreate(&blas[dev])) != CUBLAS_STATUS_SUCCESS) {
    blas[dev] = NULL;
    return mk_errorf(ctx, "%s: cublasCreate failed: %s", k, cublasGetStatusString(st));
  }
  if ((st = cublasSetStream(blas[dev], g->s)) != CUBLAS_STATUS_SUCCESS)
    return mk_errorf(ctx, "%s: cublasSetStream failed: %s", k, cublasGetStatusString(st));
  g->h = blas[dev];
  return 0;
}

/*
 * At least n bytes of device memory on g's device, kept for later calls
 * (owned here; one buffer per device, so a call asks once and carves it).
 * NULL with the error set.
 */
void *gcu_scratch(gcu_t *g, size_t n) {
  int d = g->dev;
  if (dscratch_len[d] >= n) return dscratch[d];
  if (dscratch[d] != NULL) {
    /* Queued work may still read the old buffer: wait before freeing it. */
    if (gcu_cuda(g, "cudaStreamSynchronize", cudaStreamSynchronize(g->s)) ||
        gcu_cuda(g, "cudaFree of scratch", cudaFree(dscratch[d])))
      return NULL;
    dscratch[d] = NULL, dscratch_len[d] = 0;
  }
  cudaError_t rc = cudaMalloc(&dscratch[d], n);
  if (rc != cudaSuccess) {
    dscratch[d] = NULL;
    mk_errorf(g->ctx, "%s: cudaMalloc of %zu bytes of scratch failed: %s", g->k, n, cudaGetErrorString(rc));
    return NULL;
  }
  dscratch_len[d] = n;
  return dscratch[d];
}

/* A copy on the call's stream, waited for (host sides are call scratch, reused right after). */
int gcu_copy(gcu_t *g, void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
  if (n == 0) return 0;
  if (gcu_cuda(g, "cudaMemcpyAsync", cudaMemcpyAsync(dst, src, n, kind, g->s))) return -1;
  return gcu_cuda(g, "cudaStreamSynchronize", cudaStreamSynchronize(g->s));
}

/*
 * For each of batch matrices (A + i sA, B + i sB, C + i sC), row-major:
 * C[M x N] = alpha op(A) op(B) + beta C, with leading dimensions the stored
 * row lengths. cuBLAS is column-major and a row-major matrix is its
 * transpose seen column-major, so this runs C^T = op(B)^T op(A)^T: B and A
 * swap places, as cuda_mlp's gemm. Default math mode: FP32, no TF32.
 */
int gcu_gemm(gcu_t *g, int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, long long sA,
             const float *B, int ldb, long long sB, float beta, float *C, int ldc, long long sC, int batch) {
  cublasStatus_t st = cublasSgemmStridedBatched(g->h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                N, M, K, &alpha, B, ldb, sB, A, lda, sA, &beta, C, ldc, sC, batch);
  if (st != CUBLAS_STATUS_SUCCESS)
    return mk_errorf(g->ctx, "%s: cublasSgemmStridedBatched (%dx%dx%d, batch %d) failed: %s", g->k, M, N, K, batch,
                     cublasGetStatusString(st));
  return 0;
}

/*
 * Sums n elements of device memory over grp in place (nothing to do without
 * a group of two or more). The group must be a GPU group
 * (mesh:group{dim =, gpu = true}): NCCL on ctx->stream, waited for by the
 * proc; a CPU group refuses device memory with a message naming the fix.
 * 0 or the collective's code, its message set.
 */
int gcu_all_reduce(gcu_t *g, const mk_group_t *grp, void *data, int64_t n, mk_dtype_t dt) {
  if (grp == NULL || grp->size == 1 || n == 0) return 0;
  mk_tensor_t t = {};
  t.data = data, t.dtype = dt, t.ndim = 1, t.numel = n, t.nbytes = (size_t)n * mk_dtype_size(dt), t.device = g->dev;
  t.shape[0] = n;
  return mk_all_reduce(g->ctx, grp, &t, MK_SUM);
}
