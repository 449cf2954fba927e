/* gpt_norm.c - layer norm over the last dimension (gpt.h): forward and backward. */
#include <math.h>

#include "gpt.h"

/* y = (x - mu) * rs * g + b per row, rs = 1/sqrt(var + eps); keeps mu and rs for the backward. */
void gpt_norm_forward(float *y, float *mu, float *rs, const float *x, const float *g, const float *b, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float *xr = x + (size_t)n * C;
    float *yr = y + (size_t)n * C;
    float m = 0.0f, v = 0.0f;
    for (int i = 0; i < C; i++) m += xr[i];
    m /= (float)C;
    for (int i = 0; i < C; i++) v += (xr[i] - m) * (xr[i] - m);
    float r = 1.0f / sqrtf(v / (float)C + GPT_LN_EPS);
    for (int i = 0; i < C; i++) yr[i] = (xr[i] - m) * r * g[i] + b[i];
    mu[n] = m, rs[n] = r;
  }
}

/*
 * With xh = (x - mu) * rs and dxh = dy * g:
 *   dx = rs * (dxh - mean(dxh) - xh * mean(dxh * xh)); dg += dy * xh; db += dy.
 * dx is added to (the residual stream's gradient arrives there).
 */
void gpt_norm_backward(float *dx, float *dg, float *db, const float *dy, const float *x, const float *mu,
                       const float *rs, const float *g, int N, int C) {
  for (int n = 0; n < N; n++) {
    const float *xr = x + (size_t)n * C, *dyr = dy + (size_t)n * C;
    float *dxr = dx + (size_t)n * C;
    float s1 = 0.0f, s2 = 0.0f;
    for (int i = 0; i < C; i++) {
      float xh = (xr[i] - mu[n]) * rs[n], d = dyr[i] * g[i];
      s1 += d, s2 += d * xh;
      dg[i] += dyr[i] * xh, db[i] += dyr[i];
    }
    s1 /= (float)C, s2 /= (float)C;
    for (int i = 0; i < C; i++) {
      float xh = (xr[i] - mu[n]) * rs[n];
      dxr[i] += rs[n] * (dyr[i] * g[i] - s1 - xh * s2);
    }
  }
}
