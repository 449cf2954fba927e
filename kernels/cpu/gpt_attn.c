/*
 * gpt_attn.c - causal multi-head self-attention (gpt.h): forward and backward.
 * qkv rows are [q | k | v], each nh*hs wide with head h at columns h*hs; y
 * rows are nh*hs wide in the same head order; att holds [B, nh, T, T] softmax
 * probabilities (zero above the diagonal).
 */
#include <cblas.h>
#include <math.h>

#include "gpt.h"

/* Row i of s: softmax over j <= i, 0 beyond (the causal mask). */
static void causal_softmax(float *s, int T) {
  for (int i = 0; i < T; i++) {
    float *r = s + (size_t)i * T, mx = r[0], sum = 0.0f;
    for (int j = 1; j <= i; j++) mx = r[j] > mx ? r[j] : mx;
    for (int j = 0; j <= i; j++) sum += r[j] = expf(r[j] - mx);
    for (int j = 0; j <= i; j++) r[j] /= sum;
    for (int j = i + 1; j < T; j++) r[j] = 0.0f;
  }
}

/* Per (b, h): att = softmax(q k^T / sqrt(hs)) masked causally; y = att @ v. */
void gpt_attn_forward(float *y, float *att, const float *qkv, int B, int T, int nh, int hs) {
  int W = nh * hs, W3 = 3 * W;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < nh; h++) {
      const float *q = qkv + (size_t)b * T * W3 + (size_t)h * hs, *k = q + W, *v = q + 2 * W;
      float *a = att + ((size_t)b * nh + h) * T * T;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, W3, k, W3, 0.0f, a, T);
      causal_softmax(a, T);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, W3, 0.0f,
                  y + (size_t)b * T * W + (size_t)h * hs, W);
    }
}

/*
 * With P = att and dy given: dP = dy v^T, dv = P^T dy,
 * dS = P * (dP - rowsum(P * dP)), dq = dS k / sqrt(hs), dk = dS^T q / sqrt(hs).
 * datt is [T x T] scratch. dqkv is written, not added to.
 */
void gpt_attn_backward(float *dqkv, float *datt, const float *dy, const float *att, const float *qkv, int B, int T,
                       int nh, int hs) {
  int W = nh * hs, W3 = 3 * W;
  float scale = 1.0f / sqrtf((float)hs);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < nh; h++) {
      size_t o = (size_t)b * T * W3 + (size_t)h * hs;
      const float *q = qkv + o, *k = q + W, *v = q + 2 * W, *d = dy + (size_t)b * T * W + (size_t)h * hs;
      const float *P = att + ((size_t)b * nh + h) * T * T;
      float *dq = dqkv + o, *dk = dq + W, *dv = dq + 2 * W;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, W, v, W3, 0.0f, datt, T);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, P, T, d, W, 0.0f, dv, W3);
      for (int i = 0; i < T; i++) {
        const float *pr = P + (size_t)i * T;
        float *dr = datt + (size_t)i * T, s = 0.0f;
        for (int j = 0; j <= i; j++) s += pr[j] * dr[j];
        for (int j = 0; j < T; j++) dr[j] = j <= i ? pr[j] * (dr[j] - s) : 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, datt, T, k, W3, 0.0f, dq, W3);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, datt, T, q, W3, 0.0f, dk, W3);
    }
}
