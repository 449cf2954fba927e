/* gpt_embed.c - token and position embeddings (gpt.h): forward and backward. */
#include "gpt.h"

/* x[b,t,:] = wte[tok[b,t],:] + wpe[t,:] */
void gpt_embed_forward(float *x, const uint8_t *tok, const float *wte, const float *wpe, int B, int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      float *o = x + ((size_t)b * T + t) * C;
      const float *e = wte + (size_t)tok[b * T + t] * C, *q = wpe + (size_t)t * C;
      for (int i = 0; i < C; i++) o[i] = e[i] + q[i];
    }
}

/* dwte[tok[b,t],:] += dx[b,t,:]; dwpe[t,:] += dx[b,t,:] (in a fixed order: deterministic) */
void gpt_embed_backward(float *dwte, float *dwpe, const float *dx, const uint8_t *tok, int B, int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++) {
      const float *d = dx + ((size_t)b * T + t) * C;
      float *e = dwte + (size_t)tok[b * T + t] * C, *q = dwpe + (size_t)t * C;
      for (int i = 0; i < C; i++) e[i] += d[i], q[i] += d[i];
    }
}
