/* gpt_linear.c - y = x @ W + b on sgemm (gpt.h), its backward, and the tp all-reduce. */
#include <cblas.h>

#include "gpt.h"

/* y [N x out] = x [N x in] @ W [in x out] (+ b when not NULL) */
void gpt_linear_forward(float *y, const float *x, const float *W, const float *b, int N, int in, int out) {
  float beta = 0.0f;
  if (b != NULL) {
    for (int n = 0; n < N; n++)
      for (int j = 0; j < out; j++) y[(size_t)n * out + j] = b[j];
    beta = 1.0f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, out, in, 1.0f, x, in, W, out, beta, y, out);
}

/*
 * dW += x^T @ dy; db += column sums of dy (when not NULL);
 * dx = dy @ W^T + beta_dx * dx (when dx is not NULL).
 */
void gpt_linear_backward(float *dx, float *dW, float *db, const float *dy, const float *x, const float *W, int N,
                         int in, int out, float beta_dx) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, in, out, N, 1.0f, x, in, dy, out, 1.0f, dW, out);
  if (db != NULL)
    for (int n = 0; n < N; n++)
      for (int j = 0; j < out; j++) db[j] += dy[(size_t)n * out + j];
  if (dx != NULL)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, in, out, 1.0f, dy, out, W, out, beta_dx, dx, in);
}

/* Sums n floats over the tp group (nothing to do without one); 0 or the collective's code. */
int gpt_all_reduce(gpt_comm_t *cm, float *data, int64_t n) {
  if (cm == NULL || cm->g == NULL || cm->g->size == 1) return 0;
  mk_tensor_t t = {.data = data, .dtype = MK_F32, .ndim = 1, .numel = n, .nbytes = (size_t)n * sizeof(float),
                   .device = -1};
  t.shape[0] = n;
  return mk_all_reduce(cm->ctx, cm->g, &t, MK_SUM);
}
