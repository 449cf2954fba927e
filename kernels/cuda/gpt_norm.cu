/*
 * gpt_norm.cu - layer norm over the last dimension on the device
 * (gpt_cuda.h), forward and backward; the CUDA twin of
 * kernels/cpu/gpt_norm.c. One warp per row; the gain's and bias's gradients
 * are column sums, one thread per column over the rows in order.
 */
#include "gpt_cuda.h"

/* y = (x - mu) * rs * g + b per row, rs = 1/sqrt(var + eps); keeps mu and rs. */
__global__ void norm_fwd_k(float *y, float *mu, float *rs, const float *x, const float *gain, const float *b, int N,
                           int C) {
  for (int64_t n = GCU_ROW0; n < N; n += GCU_ROW_STEP) {
    const float *xr = x + n * C;
    float *yr = y + n * C, m = 0.0f, v = 0.0f;
    for (int i = GCU_LANE; i < C; i += 32) m += xr[i];
    m = gcu_warp_sum(m) / (float)C;
    for (int i = GCU_LANE; i < C; i += 32) v += (xr[i] - m) * (xr[i] - m);
    float r = 1.0f / sqrtf(gcu_warp_sum(v) / (float)C + GPT_LN_EPS);
    for (int i = GCU_LANE; i < C; i += 32) yr[i] = (xr[i] - m) * r * gain[i] + b[i];
    if (GCU_LANE == 0) mu[n] = m, rs[n] = r;
  }
}

/* With xh = (x - mu) rs, dxh = dy g: dx += rs (dxh - mean(dxh) - xh mean(dxh xh)), per row. */
__global__ void norm_bwd_k(float *dx, const float *dy, const float *x, const float *mu, const float *rs,
                           const float *gain, int N, int C) {
  for (int64_t n = GCU_ROW0; n < N; n += GCU_ROW_STEP) {
    const float *xr = x + n * C, *dyr = dy + n * C;
    float *dxr = dx + n * C, s1 = 0.0f, s2 = 0.0f, m = mu[n], r = rs[n];
    for (int i = GCU_LANE; i < C; i += 32) {
      float d = dyr[i] * gain[i];
      s1 += d, s2 += d * (xr[i] - m) * r;
    }
    s1 = gcu_warp_sum(s1) / (float)C, s2 = gcu_warp_sum(s2) / (float)C;
    for (int i = GCU_LANE; i < C; i += 32) dxr[i] += r * (dyr[i] * gain[i] - s1 - (xr[i] - m) * r * s2);
  }
}

/* dg[i] += sum_n dy[n, i] xh[n, i]; db[i] += sum_n dy[n, i]: one thread per column, rows in order. */
__global__ void norm_params_back_k(float *dg, float *db, const float *dy, const float *x, const float *mu,
                                   const float *rs, int N, int C) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= C) return;
  float a = dg[i], c = db[i];
  for (int64_t n = 0; n < N; n++) {
    float d = dy[n * C + i];
    a += d * (x[n * C + i] - mu[n]) * rs[n];
    c += d;
  }
  dg[i] = a, db[i] = c;
}

int gcu_norm_forward(gcu_t *g, float *y, float *mu, float *rs, const float *x, const float *gain, const float *b, int N,
                     int C) {
  norm_fwd_k<<<gcu_rows_grid(N), GCU_THREADS, 0, g->s>>>(y, mu, rs, x, gain, b, N, C);
  return gcu_launched(g);
}

/* dx is added to (the residual stream's gradient arrives there); dg, db are added to. */
int gcu_norm_backward(gcu_t *g, float *dx, float *dg, float *db, const float *dy, const float *x, const float *mu,
                      const float *rs, const float *gain, int N, int C) {
  norm_bwd_k<<<gcu_rows_grid(N), GCU_THREADS, 0, g->s>>>(dx, dy, x, mu, rs, gain, N, C);
  norm_params_back_k<<<(unsigned)((C + GCU_THREADS - 1) / GCU_THREADS), GCU_THREADS, 0, g->s>>>(dg, db, dy, x, mu, rs,
                                                                                                  N, C);
  return gcu_launched(g);
}
