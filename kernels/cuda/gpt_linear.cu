/*
 * gpt_linear.cu - y = x @ W + b on cuBLAS (gpt_cuda.h), its backward, and
 * the residual add of a block; the CUDA twin of kernels/cpu/gpt_linear.c.
 * Matrices are row-major [in x out] as in gpt.h.
 */
#include "gpt_cuda.h"

/* y[n, j] = b[j]: the bias that the product is then added to (beta 1). */
__global__ void rows_of_k(float *y, const float *b, int64_t total, int out) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)blockDim.x * gridDim.x)
    y[e] = b[e % out];
}

/* db[j] += sum_n dy[n, j]: one thread per column, rows in order. */
__global__ void col_sums_add_k(float *db, const float *dy, int N, int out) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= out) return;
  float a = db[j];
  for (int64_t n = 0; n < N; n++) a += dy[n * out + j];
  db[j] = a;
}

/* dst[n, i] += a[n, i] + bias[i] */
__global__ void add_residual_k(float *dst, const float *a, const float *bias, int64_t total, int C) {
  for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total; e += (int64_t)blockDim.x * gridDim.x)
    dst[e] += a[e] + bias[e % C];
}

/* y [N x out] = x [N x in] @ W [in x out] (+ b when not NULL) */
int gcu_linear_forward(gcu_t *g, float *y, const float *x, const float *W, const float *b, int N, int in, int out) {
  float beta = 0.0f;
  if (b != NULL) {
    int64_t total = (int64_t)N * out;
    rows_of_k<<<gcu_grid(total), GCU_THREADS, 0, g->s>>>(y, b, total, out);
    if (gcu_launched(g)) return -1;
    beta = 1.0f;
  }
  return gcu_gemm(g, 0, 0, N, out, in, 1.0f, x, in, 0, W, out, 0, beta, y, out, 0, 1);
}

/*
 * dW += x^T @ dy; db += column sums of dy (when not NULL);
 * dx = dy @ W^T + beta_dx * dx (when dx is not NULL).
 */
int gcu_linear_backward(gcu_t *g, float *dx, float *dW, float *db, const float *dy, const float *x, const float *W,
                        int N, int in, int out, float beta_dx) {
  if (gcu_gemm(g, 1, 0, in, out, N, 1.0f, x, in, 0, dy, out, 0, 1.0f, dW, out, 0, 1)) return -1;
  if (db != NULL) {
    col_sums_add_k<<<(unsigned)((out + GCU_THREADS - 1) / GCU_THREADS), GCU_THREADS, 0, g->s>>>(db, dy, N, out);
    if (gcu_launched(g)) return -1;
  }
  if (dx == NULL) return 0;
  return gcu_gemm(g, 0, 1, N, in, out, 1.0f, dy, out, 0, W, out, 0, beta_dx, dx, in, 0, 1);
}

/* dst += a + bias per row (bias [C]) */
int gcu_add_residual(gcu_t *g, float *dst, const float *a, const float *bias, int N, int C) {
  int64_t total = (int64_t)N * C;
  add_residual_k<<<gcu_grid(total), GCU_THREADS, 0, g->s>>>(dst, a, bias, total, C);
  return gcu_launched(g);
}
