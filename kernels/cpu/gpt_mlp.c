/* gpt_mlp.c - GELU, the MLP's nonlinearity (gpt.h): forward and backward (tanh form, as GPT-2). */
#include <math.h>

#include "gpt.h"

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_A 0.044715f

/* g = 0.5 f (1 + tanh(k (f + a f^3))) */
void gpt_gelu_forward(float *g, const float *f, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float x = f[i];
    g[i] = 0.5f * x * (1.0f + tanhf(GELU_K * (x + GELU_A * x * x * x)));
  }
}

/* dg/df = 0.5 (1 + th) + 0.5 f (1 - th^2) k (1 + 3 a f^2), th = tanh(k (f + a f^3)) */
void gpt_gelu_backward(float *df, const float *dg, const float *f, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    float x = f[i], th = tanhf(GELU_K * (x + GELU_A * x * x * x));
    float d = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    df[i] = dg[i] * d;
  }
}
