/*
 * gpt_attn.cu - causal multi-head self-attention on the device
 * (gpt_cuda.h), forward and backward; the CUDA twin of
 * kernels/cpu/gpt_attn.c, with the same layouts: qkv rows [q | k | v], each
 * nh*hs wide, head h at columns h*hs; y rows nh*hs wide; att [B, nh, T, T]
 * softmax probabilities, zero above the diagonal.
 *
 * Per sequence b, one strided-batched cuBLAS call covers all nh heads of a
 * product (a head's q, k, v are hs columns apart; its scores T*T floats
 * apart). The softmax and its backward are one warp per row.
 */
#include <math.h>

#include "gpt_cuda.h"

/* Row r of the [rows x T] scores (row i = r % T of its head): softmax over j <= i, 0 beyond. */
__global__ void causal_softmax_k(float *s, int64_t rows, int T) {
  for (int64_t r = GCU_ROW0; r < rows; r += GCU_ROW_STEP) {
    float *p = s + r * T, mx = -INFINITY, sum = 0.0f;
    int i = (int)(r % T);
    for (int j = GCU_LANE; j <= i; j += 32) mx = fmaxf(mx, p[j]);
    mx = gcu_warp_max(mx);
    for (int j = GCU_LANE; j <= i; j += 32) sum += p[j] = expf(p[j] - mx);
    sum = gcu_warp_sum(sum);
    for (int j = GCU_LANE; j < T; j += 32) p[j] = j <= i ? p[j] / sum : 0.0f;
  }
}

/* With P = att and d = dP: d = P * (d - rowsum(P * d)) on j <= i, 0 beyond (the softmax's backward). */
__global__ void causal_softmax_back_k(float *d, const float *P, int64_t rows, int T) {
  for (int64_t r = GCU_ROW0; r < rows; r += GCU_ROW_STEP) {
    const float *pr = P + r * T;
    float *dr = d + r * T, s = 0.0f;
    int i = (int)(r % T);
    for (int j = GCU_LANE; j <= i; j += 32) s += pr[j] * dr[j];
    s = gcu_warp_sum(s);
    for (int j = GCU_LANE; j < T; j += 32) dr[j] = j <= i ? pr[j] * (dr[j] - s) : 0.0f;
  }
}

/* Per (b, h): att = softmax(q k^T / sqrt(hs)) masked causally; y = att @ v. */
int gcu_attn_forward(gcu_t *g, float *y, float *att, const float *qkv, int B, int T, int nh, int hs) {
  int W = nh * hs, W3 = 3 * W;
  long long TT = (long long)T * T;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++) {
    const float *q = qkv + (size_t)b * T * W3, *k = q + W;
    if (gcu_gemm(g, 0, 1, T, T, hs, scale, q, W3, hs, k, W3, hs, 0.0f, att + (size_t)b * nh * TT, T, TT, nh))
      return -1;
  }
  causal_softmax_k<<<gcu_rows_grid((int64_t)B * nh * T), GCU_THREADS, 0, g->s>>>(att, (int64_t)B * nh * T, T);
  if (gcu_launched(g)) return -1;
  for (int b = 0; b < B; b++) {
    const float *v = qkv + (size_t)b * T * W3 + 2 * W;
    if (gcu_gemm(g, 0, 0, T, hs, T, 1.0f, att + (size_t)b * nh * TT, T, TT, v, W3, hs, 0.0f, y + (size_t)b * T * W, W,
                 hs, nh))
      return -1;
  }
  return 0;
}

/*
 * With P = att and dy given: dP = dy v^T, dv = P^T dy,
 * dS = P * (dP - rowsum(P * dP)), dq = dS k / sqrt(hs), dk = dS^T q / sqrt(hs).
 * datt is [nh x T x T] scratch (one sequence's heads). dqkv is written, not added to.
 */
int gcu_attn_backward(gcu_t *g, float *dqkv, float *datt, const float *dy, const float *att, const float *qkv, int B,
                      int T, int nh, int hs) {
  int W = nh * hs, W3 = 3 * W;
  long long TT = (long long)T * T;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++) {
    size_t o = (size_t)b * T * W3;
    const float *q = qkv + o, *k = q + W, *v = q + 2 * W, *d = dy + (size_t)b * T * W, *P = att + (size_t)b * nh * TT;
    float *dq = dqkv + o, *dk = dq + W, *dv = dq + 2 * W;
    if (gcu_gemm(g, 0, 1, T, T, hs, 1.0f, d, W, hs, v, W3, hs, 0.0f, datt, T, TT, nh) ||
        gcu_gemm(g, 1, 0, T, hs, T, 1.0f, P, T, TT, d, W, hs, 0.0f, dv, W3, hs, nh))
      return -1;
    causal_softmax_back_k<<<gcu_rows_grid((int64_t)nh * T), GCU_THREADS, 0, g->s>>>(datt, P, (int64_t)nh * T, T);
    if (gcu_launched(g)) return -1;
    if (gcu_gemm(g, 0, 0, T, hs, T, scale, datt, T, TT, k, W3, hs, 0.0f, dq, W3, hs, nh) ||
        gcu_gemm(g, 1, 0, T, hs, T, scale, datt, T, TT, q, W3, hs, 0.0f, dk, W3, hs, nh))
      return -1;
  }
  return 0;
}
